"""The reward service's learner: Cooper's RM update on the groups the service has scored.

A step is `groups_per_update` complete groups (set it to the trainer's prompts per step, `--rollout.batch_size`,
and a synchronous trainer's step t is one step here: the RM moves exactly between steps, the paper's timing; the
service's published names keep their old word: `serve/published_names.py`). Per step the core's pair pipeline
(`core.build_pairs`, the one the trainer runs): positives are the rollouts the rule verifier marks correct,
rollouts are proved wrong by the same verifier pool (`core.pair_builder.PairBuilder`), negatives come from the
group's own proven-wrong rollouts (`negative_source` "rollout", the default here: no generation needed) or an
assistant's rewrites through an OpenAI-compatible endpoint ("assistant" / "mixed"); then
`rm.pairwise_update.pairwise_update`, the RM actor's own update, on a DeepSpeed engine prepared as the actor's. The
trained weights are published to the scorer as the next version (`rm/scorer.py`).

The RM guard (`core/rm_health.py`, `--rm-guard`): before an update the engine's state is held in memory
(`rm/snapshot.py`); after it the RM scores its anchors (`rm/anchors.py`) and the guard judges the version. A version
out of bounds, or whose weights are not finite (checked for every dtype, guard or not: DeepSpeed 0.19.6 has no
overflow check in fp32), is never published, nor is what an update that raised half made (its snapshot is restored
before the error goes on): `learn` restores the last healthy weights and optimizer state, takes
the guard's response (a lower learning rate, or steps without an update) and returns updated=False, so the
service keeps serving its last healthy version. The guard's state rides in the RM update's counters
(`GUARD_STATE` in `RMTrainer.counters`), which `serve/checkpoint.py` checkpoints with the engine in either mode of
the service, so a restart resumes mid-guard. With --rm-anchor-weight the update is anchored (`rm/pairwise_update.py`).

Runs in the service's learner thread, one step at a time; knows nothing of HTTP.
"""

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cooper_openrlhf.algo.metric_keys import PAID_REWARD
from cooper_openrlhf.algo.pairs import PairBatch
from cooper_openrlhf.core import PairConfig, PayConfig, RMGuard, Rollouts, RolloutTexts, RolloutVerdicts, build_pairs
from cooper_openrlhf.core.pay import reward_metrics, rm_pay
from cooper_openrlhf.core.rm_health import HEALTH, RMHealth, health_of
from cooper_openrlhf.core.rollouts import verdict_metrics
from cooper_openrlhf.rm.anchors import anchor_batch
from cooper_openrlhf.rm.model import score_logits
from cooper_openrlhf.rm.pairwise_update import RMTrainer, pairwise_update
from cooper_openrlhf.rm.snapshot import EngineSnapshot, scale_lr, weights_finite
from cooper_openrlhf.serve.groups import Group

logger = logging.getLogger(__name__)

GUARD_STATE = "rm_guard"  # the guard's state in RMTrainer.counters (checkpointed with the engine)


@dataclass(frozen=True)
class LearnConfig:
    """How the learner makes a step's pairs (the core's `PairConfig`, as the trainer's: its n_samples_per_prompt is
    the service's group size, its seed the update's too) and trains on them."""

    pairs: PairConfig
    passes: int = 1  # optimizer steps over a step's pairs (--cooper.rm_updates_per_step)
    anchor_weight: float = 0.0  # > 0: anchored updates, BCE on labelled rows at this weight (--rm-anchor-weight)
    anchor_batch: int = 16  # labelled rows per anchored update
    health_batch_size: int = 32  # anchors per forward when the guard scores them


def rollouts_of(groups: list[Group]) -> tuple[Rollouts, list]:
    """A step's complete groups as the core reads them (flat, prompt-grouped: P groups x n), and the samples'
    (B,) verdicts (`verify.rule.Verdict`). Proven-wrong flags are the prepared groups' (all False where none is)."""
    scored = [s for group in groups for s in group.scored]
    verdicts = [s.outcome.verdict for s in scored]
    proven = [wrong for group in groups for wrong in (group.proven_wrong or [False] * len(group.scored))]
    texts = RolloutTexts([s.sample.question for s in scored], [s.sample.reference for s in scored],
                         [s.sample.completion for s in scored])
    return Rollouts(texts, RolloutVerdicts.of(verdicts, proven), [s.logit for s in scored]), verdicts


def step_metrics(groups: list[Group], pay: PayConfig) -> dict[str, float]:
    """What the hacking monitor reads of a step: the RM's pay (in `pay`'s form, whoever pays) next to the rule
    verifier's verdicts, under the trainer's keys, and what the trainer was paid."""
    rollouts, verdicts = rollouts_of(groups)
    paid = [s.reward for group in groups for s in group.scored]
    by_rm = rm_pay(pay, rollouts.rm_logits, rollouts.verdicts.answerless)
    return {**verdict_metrics(verdicts), **reward_metrics(rollouts.verdicts, by_rm),
            PAID_REWARD: sum(paid) / len(paid), "cooper/samples": float(len(paid))}


class Learner:
    """Builds a step's pairs and trains the RM on them; see the module docstring.

    pair_builder: a `core.pair_builder.PairBuilder` over the service's verifier pool (and assistant engine): the
    core's verifier and assistant side, as the trainer's pair actor holds one.
    guard, anchors: the RM guard (`core.RMGuard`; None, or mode off, or no anchors: only the weights' finiteness is
    checked) and the anchors it scores (`rm.probes.Probe`s). anchor_rows: the labelled rows anchored updates train on.
    """

    def __init__(self, trainer: RMTrainer, pair_builder, config: LearnConfig, guard: RMGuard | None = None,
                 anchors: Sequence = (), anchor_rows: Sequence = ()):
        self.trainer, self.pair_builder, self.config = trainer, pair_builder, config
        self.anchors, self.anchor_rows = list(anchors), list(anchor_rows)
        self.guard = guard if guard is not None and guard.config.measures and self.anchors else None
        self._guard_written = None  # the guard state last put in the counters (others came from a checkpoint)

    def prepare(self, group: Group) -> None:
        """Prove which of a complete group's samples are wrong (the verifier's both-ways check, the slow part of
        building pairs), as soon as the group completes: a step's update then waits only for its last group."""
        group.proven_wrong = self.pair_builder.proven_wrong([s.sample.reference for s in group.scored],
                                                            [s.outcome for s in group.scored])

    def pairs_of(self, groups: list[Group], step: int) -> tuple[PairBatch, dict[str, float]]:
        """The step's PairBatch (one slot per group) and its `cooper/*` pair metrics (`core.build_pairs`)."""
        for group in groups:
            if group.proven_wrong is None:
                self.prepare(group)
        rollouts, _ = rollouts_of(groups)
        return build_pairs(self.config.pairs, rollouts.texts, rollouts.verdicts, rollouts.rm_logits,
                           self.pair_builder.assistant_negatives, step)

    def discard_gradients(self) -> None:
        """Drop whatever gradients a failed update left accumulated, so the next step's update holds only its own.

        What DeepSpeed's ZeRO 1/2 optimizer itself does when it skips a step on overflow (`stage_1_and_2.step`)."""
        engine = self.trainer.model
        engine.zero_grad()
        optimizer = getattr(engine, "optimizer", None)
        if optimizer is None:
            return
        optimizer.zero_grad(set_to_none=True)
        if hasattr(optimizer, "_release_preflattened_grad_buffers"):
            optimizer._release_preflattened_grad_buffers()
        if getattr(optimizer, "cpu_offload", False):
            optimizer.reset_cpu_buffers()
        for buffers in ("averaged_gradients", "all_grad_tensors"):
            held = getattr(optimizer, buffers, None)
            if isinstance(held, dict):
                for key in held:
                    held[key] = None

    def learn(self, groups: list[Group], step: int) -> tuple[bool, dict[str, float]]:
        """(whether a new version is to be published, metrics): the step's pairs and one Cooper RM update on them,
        kept only if its weights are finite and the guard finds it healthy (module docstring)."""
        start = time.perf_counter()
        pairs, metrics = self.pairs_of(groups, step)
        metrics["timing/serve_pairs"] = time.perf_counter() - start
        guard = self._synced_guard()
        if guard is not None and not guard.started:  # the starting RM (or the one a guardless checkpoint held)
            logger.info("%s", guard.start(self.health(metrics)))
        if guard is not None and guard.skip_update():
            logger.info("step %d: RM update skipped by the RM guard (%d more to skip)", step, guard.skip_left)
            metrics.update({"cooper/rm_updated": 0.0, **guard.metrics()})
            self._save_guard()
            return False, metrics
        start = time.perf_counter()
        snapshot = EngineSnapshot.take(self.trainer)
        metrics[HEALTH + "snapshot_seconds"] = time.perf_counter() - start
        anchored = self.config.anchor_weight > 0 and self.anchor_rows
        rows = anchor_batch(self.anchor_rows, self.config.anchor_batch, step, self.config.pairs.seed) if anchored else ()
        try:
            metrics.update(pairwise_update(self.trainer, pairs, pairs.num_valid, passes=self.config.passes,
                                           anchors=rows, anchor_weight=self.config.anchor_weight if anchored else 0.0))
            updated = bool(metrics["cooper/rm_updated"]) \
                and metrics.get("cooper/rm_steps_skipped", 0) < self.config.passes
            if updated:
                updated = self._keep_or_roll_back(snapshot, step, metrics)
        except BaseException:
            # Weights an update half made are never kept: the next checkpoint would save them under the version
            # being served (one number, two sets of weights), perhaps not finite.
            snapshot.restore()
            raise
        if not pairs.num_valid:
            logger.info("step %d: no valid pair in %d groups; the RM is unchanged", step, len(groups))
        if not updated and guard is not None:
            metrics.update(guard.metrics())
        if guard is not None:
            self._save_guard()
        return updated, metrics

    def health(self, metrics: dict | None = None) -> RMHealth:
        """What the engine's RM (the version being trained) pays the anchors: sigmoid(logit), as the RM pays."""
        start = time.perf_counter()
        t, anchors = self.trainer, self.anchors
        logits = score_logits(t.model, t.tokenizer, [a.question for a in anchors], [a.reference for a in anchors],
                              [a.completion for a in anchors], max_length=t.max_length,
                              template_version=t.template_version, batch_size=self.config.health_batch_size)
        health = health_of(anchors, torch.sigmoid(torch.tensor(logits, dtype=torch.float64)).tolist())
        if metrics is not None:
            metrics[HEALTH + "seconds"] = time.perf_counter() - start
        return health

    def _keep_or_roll_back(self, snapshot: EngineSnapshot, step: int, metrics: dict) -> bool:
        """After an update: keep it (True) or restore the snapshot and take the guard's response (False)."""
        start = time.perf_counter()
        finite = weights_finite(self.trainer.model.module)
        what = f"step {step}'s RM update (update {self.trainer.counters['updates']})"
        if self.guard is None:
            if not finite:
                snapshot.restore()
                metrics["cooper/rm_nonfinite_weights"] = 1.0
                logger.warning("%s made non-finite weights: not published; the previous weights and optimizer state "
                               "are restored", what)
            return finite
        measured = self.health()
        decision = self.guard.judge(measured, what, finite)
        if decision.rollback:
            snapshot.restore()
            if decision.lr_factor != 1.0:
                scale_lr(self.trainer, decision.lr_factor)
        if decision.message:
            logger.warning("%s%s", decision.message, "; not published" if decision.rollback else "")
        # the whole check: finiteness, the anchors' scores, the decision and its rollback (plus any baseline read)
        metrics[HEALTH + "seconds"] = metrics.get(HEALTH + "seconds", 0.0) + time.perf_counter() - start
        metrics.update(self.guard.metrics(measured, decision))
        return not decision.rollback

    def _synced_guard(self) -> RMGuard | None:
        """The guard, with the state a checkpoint restored into the counters (`serve/checkpoint.py` loads them)."""
        held = self.trainer.counters.get(GUARD_STATE) if self.guard is not None else None
        if held is not None and held is not self._guard_written:
            self.guard.load_state_dict(held)
            self._guard_written = held
        return self.guard

    def _save_guard(self) -> None:
        self._guard_written = self.trainer.counters[GUARD_STATE] = self.guard.state_dict()

    def health_gauges(self) -> dict[str, float]:
        """`rm_health_*` for the service's /metrics (`core.RMGuard.gauges`); empty without a guard."""
        guard = self._synced_guard()
        return guard.gauges() if guard is not None else {}
