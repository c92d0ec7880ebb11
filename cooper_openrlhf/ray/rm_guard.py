"""The RM guard in the trainer, a mixin of `ray/trainer.CooperPPOTrainer` (the pure part: `core/rm_health.py`).

Around each RM update (`update_rm`): a skip the guard owes is taken first (no update); the starting RM's health is
measured once (the baseline); every RM rank holds its state in memory (`snapshot`, `rm/snapshot.py`); the update
runs; then the RM scores the anchors (`rm/anchors.py`, through the RM group as rollouts are scored) and every rank
says whether its weights are finite. The guard judges: a version out of bounds is rolled back on every rank
(weights, optimizer, schedule, counters) before the next step is scored, so no step is ever scored by it, and the
response is taken (`scale_lr` on every rank, a skip, or a stop: the step is checkpointed with the healthy RM and the
run ends with `RMGuardStop`). Metrics `cooper/rm_health/*` each step; the guard's state travels in the checkpoint's
client states (`RM_GUARD_STATE`, beside the hacking response's) and a resume restores it.

Anchors: `--cooper.rm_anchors FILE`, else the VerifyRM recipe's eval_split.jsonl beside --reward.model_name_or_path,
plus the probe suite on --cooper.rm_anchor_probe_problems problems of --eval.dataset. Without any the guard is off
(one warning at start-up). Only an RM that learns (--remote_rm_trainable) is guarded.
"""

import time

import ray
import torch
from openrlhf.utils.logging_utils import init_logger

from cooper_openrlhf.algo.pairs import even_slices
from cooper_openrlhf.core import GuardConfig, RMGuard, RMHealth, RolloutTexts, health_of
from cooper_openrlhf.core.rm_health import HEALTH
from cooper_openrlhf.rm.anchors import anchor_batch, anchor_sets, describe
from cooper_openrlhf.ray.trainer_state import CooperTrainerState, rank_actors

logger = init_logger(__name__)

RM_GUARD_STATE = "cooper_rm_guard"  # in the checkpoints' client states


class RMGuardStop(RuntimeError):
    """--cooper.rm_guard_response stop: the RM left its bounds; the step was checkpointed with the healthy RM."""


class RMGuarding(CooperTrainerState):
    """The RM guard's wiring (module docstring). Calls `rm_logits` (`ray/rm_scoring.py`)."""

    rm_guard: RMGuard | None
    rm_anchors: list
    rm_anchor_rows: list

    def init_rm_guard(self, problems) -> None:
        """The anchors and the guard (None when off, frozen or without anchors). In the trainer's own thread: the
        probes' labels come from math-verify."""
        self.rm_guard, self.rm_anchors, self.rm_anchor_rows = None, [], []
        config = GuardConfig.from_namespace(self.cooper)
        anchored = getattr(self.cooper, "rm_anchor_weight", 0.0) > 0
        if not self.rm_trainable or not (config.measures or anchored):
            return
        self.rm_anchors, self.rm_anchor_rows, source = anchor_sets(
            self.args.reward.model_name_or_path, self.cooper.rm_anchors, self.cooper.rm_anchor_rows, problems,
            self.cooper.rm_anchor_probe_problems, self.args.train.seed)
        if anchored and not self.rm_anchor_rows:
            logger.warning("--cooper.rm_anchor_weight %g: no labelled rows beyond the guard's to train on (%s); RM "
                           "updates are not anchored", self.cooper.rm_anchor_weight, source)
        if not config.measures:
            return
        if not self.rm_anchors:
            logger.warning("RM guard off: no anchors (%s, and no --eval.dataset problem with an integer reference); "
                           "pass --cooper.rm_anchors FILE of labelled rows kept out of the RM's training", source)
            return
        self.rm_guard = RMGuard(config)
        logger.info("RM guard %s (response %s): %s (%s)", config.mode, config.response, describe(self.rm_anchors),
                    source)

    # ----------------------------------------------------------------------------------- measures
    def rm_health(self, metrics: dict | None = None) -> RMHealth:
        """What the RM group pays the anchors now (sigmoid of its logits, whatever the reward form)."""
        start = time.perf_counter()
        anchors = self.rm_anchors
        logits = self.rm_logits(RolloutTexts([a.question for a in anchors], [a.reference for a in anchors],
                                             [a.completion for a in anchors]))
        health = health_of(anchors, torch.sigmoid(logits.double()).tolist())
        if metrics is not None:
            metrics[HEALTH + "seconds"] = metrics.get(HEALTH + "seconds", 0.0) + time.perf_counter() - start
        return health

    def anchor_shares(self, step: int, ranks: int) -> tuple[list, float]:
        """(each rank's anchor rows, the weight) of an anchored update at `step`; ([[]] * ranks, 0) without one."""
        weight = getattr(self.cooper, "rm_anchor_weight", 0.0)
        if weight <= 0 or not self.rm_anchor_rows:
            return [[] for _ in range(ranks)], 0.0
        rows = anchor_batch(self.rm_anchor_rows, self.cooper.rm_anchor_batch, step, self.args.train.seed)
        return [rows[part] for part in even_slices(len(rows), ranks)], weight

    # ----------------------------------------------------------------------------- around an update
    def guard_before_update(self, step: int) -> dict | None:
        """Before step `step`'s RM update (states loaded): the metrics of a skipped update (None: go on); else the
        baseline once, and every rank's snapshot."""
        guard = self.rm_guard
        if guard is None:
            return None
        metrics: dict = {}
        if not guard.started:
            logger.info("%s", guard.start(self.rm_health(metrics)))
        if guard.skip_update():
            logger.info("step %d: RM update skipped by the RM guard (%d more to skip)", step, guard.skip_left)
            return {**metrics, **guard.metrics(), "cooper/rm_updated": 0.0}
        start = time.perf_counter()
        ray.get(self.rm_group.async_run_method(method_name="snapshot"))
        self._guard_pending = {HEALTH + "snapshot_seconds": time.perf_counter() - start, **metrics}
        return None

    def guard_after_update(self, step: int, updated: bool) -> dict[str, float]:
        """After the update: measure, judge, and roll back or keep (module docstring); the step's metrics."""
        guard = self.rm_guard
        if guard is None:
            return {}
        start = time.perf_counter()
        metrics = dict(getattr(self, "_guard_pending", {}))
        self._guard_pending = {}
        if not updated:
            ray.get(self.rm_group.async_run_method(method_name="drop_snapshot"))
            return {**metrics, **guard.metrics()}
        finite = all(ray.get(self.rm_group.async_run_method(method_name="weights_finite")))
        measured = self.rm_health()
        decision = guard.judge(measured, f"the RM after step {step}'s update", finite)
        if decision.rollback:
            # the update's own metrics counted the optimizer step the rollback undid
            metrics["cooper/rm_optimizer_steps"] = ray.get(self.rm_group.async_run_method(
                method_name="restore_snapshot"))[0]
            if decision.lr_factor != 1.0:
                ray.get(self.rm_group.async_run_method(method_name="scale_lr", factor=decision.lr_factor))
        else:
            ray.get(self.rm_group.async_run_method(method_name="drop_snapshot"))
        if decision.message:
            logger.warning("%s", decision.message)
        # the whole check: finiteness, the anchors' scores, the decision and its rollback (plus any baseline read)
        metrics[HEALTH + "seconds"] = metrics.get(HEALTH + "seconds", 0.0) + time.perf_counter() - start
        return {**metrics, **guard.metrics(measured, decision)}

    # ---------------------------------------------------------------------------------- checkpoints
    def with_cooper_states(self, client_states) -> dict:
        states = super().with_cooper_states(client_states)
        if self.rm_guard is not None:
            states[RM_GUARD_STATE] = self.rm_guard.state_dict()
        return states

    def init_checkpoint_states(self):
        states = super().init_checkpoint_states()
        if self.rm_guard is not None and states.get(RM_GUARD_STATE):
            self.rm_guard.load_state_dict(states[RM_GUARD_STATE])
            logger.info("resumed the RM guard at step %d: %d rollback(s), %d update(s) still to skip, lr x%g",
                        states["global_step"], self.rm_guard.rollbacks, self.rm_guard.skip_left,
                        self.rm_guard.lr_scale)
        return states

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        """OpenRLHF's (and the checkpoint unit's); then, after a rollback under response stop, the step is
        checkpointed (off --ckpt.save_steps' schedule) with the healthy RM and the run ends."""
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        if self.rm_guard is not None and self.rm_guard.stopped:
            if global_step % self.args.ckpt.save_steps != 0:
                self.save_checkpoint_now(global_step, self.with_cooper_states(client_states))
            raise RMGuardStop(f"the RM left its health bounds at step {global_step} (the log line above says how); "
                              f"--cooper.rm_guard_response stop rolled it back, saved checkpoint "
                              f"global_step{global_step} under {self.args.ckpt.path} and ended the run")
