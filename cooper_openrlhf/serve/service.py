"""RewardService: score, verify, group, learn, watch and checkpoint; the async core behind the HTTP app.

Per sample (any number arrive concurrently, one per request from OpenRLHF):
  1. reserve its place in its prompt's GRPO group (`serve/book.py`, `serve/groups.py`): that fixes the RM version
     scoring it. With `wait_for_update` (the default) the first sample of a NEW group waits while an update is in
     flight, so a synchronous trainer's step t+1 is scored by the RM updated on step t, as in the paper; samples of
     groups already open never wait (their version is pinned).
  2. RM logit (`rm/scorer.py`, by version, batched across requests) and rule verdict (`verify.pool`, batched, in lanes)
     at the same time; the reward of the service's mode (`core.REWARD_MODES`, the trainer's reward forms).
  3. record it in its group. Complete groups gather into steps of `groups_per_update` (`serve/step_supervisor.py`);
     each step is read by the hacking response (`core.HackingResponse`, the trainer's) and, with learning on,
     trained on (`serve/learner.py`) in the learner thread; the new version is published when the update ends. On
     an alarm the service can switch to the rule reward (`on_hacking`). With neither steps nor learning nothing
     reads a group, so none is kept: the version never changes and a sample is scored and forgotten (memory stays
     flat over any number of groups). With steps, what is kept is the open groups (each until complete, or
     dropped: `serve/groups.py`), a few steps' complete groups and the last answers (for retries).
A sample identical to one already answered (a retry whose 200 was lost, or the policy's duplicate) gets the
recorded answer, unscored (`serve/groups.py`). Whatever the trainer's groups look like, a well-formed sample is
scored and answered: a group the bookkeeping cannot place costs learning (counted and explained at /health and
/metrics), never an answer (serve/trainer_groups.py).
Every `checkpoint_every` updates, and on shutdown, the RM's DeepSpeed state (model, optimizer, schedule), the
version, the counters, the groups not yet learned from and the weights of the older versions open groups are
pinned to are committed as a new checkpoint (`serve/checkpoint.py`: a kill at any moment leaves the previous one
loadable); a restart resumes from there and finishes the open groups with their own versions. A group pinned to a
version the checkpoint does not hold is re-pinned to the restored version and counted (`groups_repinned`): its
remaining samples are scored, never refused.

Steps are supervised: an exception anywhere in a step (pairs, RM update, publish, checkpoint, hacking monitor,
metrics log) or in the loop's expiry is logged with its traceback, counted (`STEP_FAILURES` at /metrics), shown
in /health (`"learning": "failing: <error>"` until a step succeeds again, "ok" otherwise), the engine's
gradients are discarded, and the next step runs as usual: scoring never stops for it. A checkpoint that failed is
tried again at the next step.

Failures are never a reward: a sample that cannot be scored raises (the HTTP layer answers 5xx and the client
retries), its group place is released; a non-finite RM logit is such a failure (`NonFiniteScore`), so it is
neither paid nor recorded for learning. Scoring waits for the batchers however busy they are; the bound on work
in flight is the HTTP layer's (`serve/admission.py`).
"""

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from cooper_openrlhf.algo.hacking import ALARM_RESPONSES, HackingMonitorConfig
from cooper_openrlhf.core import REWARD_MODES, HackingResponse
from cooper_openrlhf.runtime.cpu_threads import pin_threads
from cooper_openrlhf.runtime.registry import Registry
from cooper_openrlhf.serve.batcher import MicroBatcher
from cooper_openrlhf.serve.book import GroupBook, Wanted
from cooper_openrlhf.serve.contract import NonFiniteScore, Scored  # noqa: F401 (tests read them here too)
from cooper_openrlhf.serve.groups import (DEFAULT_SILENCE_S, DEFAULT_TIMEOUT_S, REMEMBERED_ANSWERS, Group, GroupTracker,
                                          fingerprint)
from cooper_openrlhf.serve.protocol import Sample
from cooper_openrlhf.serve.published_names import STEP_FAILURES, STEPS_COUNTER
from cooper_openrlhf.serve.step_supervisor import group_gauges
from cooper_openrlhf.serve.steps import (answers, check_finite, count_update, monitored_metrics, paid_samples, rm_item,
                                         watch_and_log)

logger = logging.getLogger(__name__)

# What the service may do on an alarm: algo.hacking's responses but `stop` (a service has no run to end).
ON_HACKING = Registry("--on-hacking", {name: ALARM_RESPONSES[name] for name in ("warn", "rule_reward")})


@dataclass(frozen=True)
class ServiceConfig:
    """How the service batches, groups, pays and learns (one field per `cli.serve` flag)."""

    mode: str = "rm"  # core.REWARD_MODES
    group_size: int = 8  # the trainer's n_samples_per_prompt
    groups_per_update: int = 0  # complete groups per step (the trainer's prompts per step); 0: no steps
    group_timeout_s: float = DEFAULT_TIMEOUT_S  # a group that gets no sample this long is dropped from learning
    stale_after_s: float = DEFAULT_SILENCE_S  # after this long without any sample, partial groups are dropped
    partial_step_after_s: float = 30.0  # complete groups left when the trainer went quiet form a step after this
    retry_record: int = REMEMBERED_ANSWERS  # answers kept to recognise a retried sample (serve/groups.py)
    max_batch: int = 64
    max_wait_s: float = 0.005
    wait_for_update: bool = True
    update_wait_timeout_s: float = 300.0  # a new group waits at most this long for an update, then takes the latest
    checkpoint_every: int = 1  # updates between checkpoints (0: only on shutdown)
    on_hacking: str = "warn"  # ON_HACKING: warn | rule_reward
    check_groups: bool = True  # warn when the trainer's groups are not the service's (serve/trainer_groups.py)
    heldout: frozenset = frozenset()  # questions of held-out prompts: scored, never grouped or learned from
    monitor: HackingMonitorConfig = field(default_factory=HackingMonitorConfig)

    def __post_init__(self) -> None:
        REWARD_MODES.check(self.mode)
        ON_HACKING.check(self.on_hacking)
        if self.group_size < 1 or self.groups_per_update < 0:
            raise ValueError("group_size must be >= 1 and groups_per_update >= 0")


def _log_failed_preparation(future) -> None:
    """A group the learner could not prepare is prepared again when its step is learned from (and fails there)."""
    if not future.cancelled() and future.exception() is not None:
        logger.warning("preparing a complete group failed (retried at its step): %s", future.exception())


class RewardService(GroupBook):
    """See the module docstring; the one-process host of `serve.contract.RewardHost`. `scorer`: an
    `rm.scorer.RMScorer`; `verify_lanes`: one blocking (references, completions) -> outcomes function per lane;
    `learner`: a `serve.learner.Learner` or None; `checkpointer`: a `serve.checkpoint.ServiceCheckpoint` or None;
    `log`: a `serve.metrics.ServiceLog`."""

    def __init__(self, config: ServiceConfig, scorer, verify_lanes, log, learner=None, checkpointer=None,
                 state: dict | None = None, probe=None):
        self.config, self.scorer, self.learner, self.checkpointer, self.log = config, scorer, learner, checkpointer, log
        self.probe = probe  # a serve.probing.ServiceProbe, or None
        self.pay = REWARD_MODES[config.mode]
        self.groups = GroupTracker(config.group_size, config.group_timeout_s, silence_s=config.stale_after_s,
                                   remembered=config.retry_record)
        self.rm_batcher = MicroBatcher(scorer.logits_of, config.max_batch, config.max_wait_s, "rm", inline_lone=True)
        self.verify_batcher = MicroBatcher(
            [lambda items, lane=lane: lane([r for r, _ in items], [c for _, c in items]) for lane in verify_lanes],
            config.max_batch, config.max_wait_s, "verifier")
        # Groups are read by steps (the monitor) and the learner; with neither, none is kept (module docstring).
        self.keeps_groups = learner is not None or config.groups_per_update > 0
        self.hacking = HackingResponse(config.monitor, config.on_hacking)
        self.ready: list[Group] = []  # complete groups not yet in a step
        self.counters = {STEPS_COUNTER: 0, "updates": 0, "pairs": 0, "samples": 0, "alarms": 0, "heldout_samples": 0}
        self.last_step: dict[str, float] = {}
        self.update_done = asyncio.Event()
        self.update_done.set()
        self._step_wakeup = asyncio.Event()
        # The learner trains on every core whatever thread count the scorer runs its forwards with
        # (`runtime/cpu_threads.py`): pinned when its thread starts.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cooper-learner",
                                            initializer=pin_threads, initargs=(torch.get_num_threads(),))
        self._steps: asyncio.Task | None = None
        self._closing = False
        self._waited = 0.0  # seconds new groups spent waiting for updates since the last step
        self.step_failures = 0
        self.step_error: str | None = None  # the last step's failure; None once a step succeeds
        self.groups_repinned = 0
        self._checkpointed_updates = 0  # `updates` at the last checkpoint
        self._init_group_checks()
        if state:
            self._load_state(state)

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.rm_batcher.start()
        self.verify_batcher.start()
        self._steps = asyncio.get_running_loop().create_task(self._step_loop(), name="steps")

    async def stop(self, save: bool = True) -> None:
        """Finish the update in flight, checkpoint (with learning on), stop the batchers."""
        self._closing = True
        await self.update_done.wait()
        if self._steps is not None:
            self._steps.cancel()
        try:
            if save and self.checkpointer is not None:
                await self._checkpoint()  # a new checkpoint beside the live one (serve/checkpoint.py)
        finally:
            await self.rm_batcher.stop()
            await self.verify_batcher.stop()
            self._executor.shutdown(wait=True)
            self.log.close()

    @property
    def mode(self) -> str:
        """The reward mode being paid: the configured one, or "rule" once a hacking alarm switched to it."""
        return "rule" if self.hacking.paying_rule else self.config.mode

    @property
    def version(self) -> int:
        return self.scorer.latest

    # -------------------------------------------------------------------------------------- scoring
    async def score(self, samples: list[Sample]) -> list[Scored]:
        """Rewards of the samples (one request's); raises when any cannot be scored."""
        if self._closing:
            raise RuntimeError("the service is shutting down")
        keyed = self.keeps_groups  # (an identical sample is looked for only where groups are kept)
        places = await self._reserve_places([Wanted(s.prompt, s.reference, fingerprint(s) if keyed else b"",
                                                    s.question in self.config.heldout) for s in samples])
        todo = [i for i, place in enumerate(places) if place.known is None]  # the rest were answered before
        try:
            # The verifier's first: its lane hands the items to its worker before the RM's lane may hold the loop
            # with a lone forward (serve/batcher.py), so the two still overlap.
            outcomes, logits = await asyncio.gather(
                self.verify_batcher.submit_many([(samples[i].reference, samples[i].completion) for i in todo]),
                self.rm_batcher.submit_many([rm_item(places[i].version, samples[i]) for i in todo]))
            check_finite(todo, logits)
        except BaseException:  # (a request cancelled while waiting gives back too)
            self._release_places([places[i] for i in todo])
            raise
        scored = paid_samples(self.pay, [samples[i] for i in todo], logits, outcomes, self.hacking.paying_rule)
        self._record_places([places[i] for i in todo], scored)
        self.counters["samples"] += len(samples)
        self._wake_steps()
        return answers(places, todo, scored)

    def _repeated(self, complete: Group | None) -> None:
        self._completed(complete)

    def _holds_version(self, version: int) -> bool:
        return version in self.scorer.versions()

    def _retire_versions(self, in_use: set[int]) -> None:
        self.scorer.retire(in_use)

    def _completed(self, complete: Group | None) -> None:
        """After a sample is recorded: a group it completed joins the steps, its pairs' slow part started now."""
        self._recorded(complete)
        if complete is not None and self.learner is not None:  # in the learner thread, not at the step's end
            prepared = asyncio.get_running_loop().run_in_executor(self._executor, self.learner.prepare, complete)
            prepared.add_done_callback(_log_failed_preparation)

    # --------------------------------------------------------------------------------------- steps
    def _wake_steps(self) -> None:
        self._step_wakeup.set()

    def _steps_done(self) -> int:
        return self.counters[STEPS_COUNTER]

    def _step_failed(self, what: str, exc: Exception) -> None:
        """Log, count and show a failure; leave the engine as a fresh step expects it (no stale gradients)."""
        super()._step_failed(what, exc)
        if self.learner is not None:
            try:
                self.learner.discard_gradients()
            except Exception:
                logger.exception("discarding the failed step's gradients failed too")

    async def _run_step(self, index: int, groups: list[Group]) -> None:
        """One step: its metrics, the RM update and publish (with learning), the hacking monitor, the log line,
        then a checkpoint when due. Raises what failed (after the monitor and the log line when the update failed:
        the step is still watched); the step counts either way, and its groups are not retried."""
        self.counters[STEPS_COUNTER] += 1
        started = time.perf_counter()
        metrics = monitored_metrics(groups, self.pay)
        update_failure = None
        if self.learner is not None:
            metrics["timing/serve_waited"], self._waited = self._waited, 0.0  # new groups' waits for the last update
            self.update_done.clear()
            try:
                updated, learned = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self.learner.learn, groups, index)
                metrics.update(learned)
                if updated:
                    start = time.perf_counter()
                    await asyncio.get_running_loop().run_in_executor(
                        self._executor, self.scorer.publish, self.learner.trainer.model.module)
                    metrics["timing/serve_publish"] = time.perf_counter() - start
                    count_update(self.counters, learned)
            except Exception as exc:  # nothing new published; raised below, once the step is logged
                update_failure = exc
                metrics["cooper/rm_update_failed"] = 1.0
            finally:
                self.update_done.set()
            metrics["cooper/rm_version_after"] = float(self.version)
        if self.probe is not None and self.probe.due(index):  # before the monitor: its rules may read them
            metrics.update(await asyncio.get_running_loop().run_in_executor(self._executor, self.probe.read,
                                                                            self.scorer))
        watch_and_log(index, metrics, self.hacking, self.counters, self.log, started)
        self.last_step = metrics
        if update_failure is not None:
            raise update_failure
        # Due counts from the last checkpoint that succeeded: one that failed is tried again next step.
        every = self.config.checkpoint_every
        if self.checkpointer is not None and every and self.counters["updates"] - self._checkpointed_updates >= every:
            await self._checkpoint()

    # ---------------------------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        """Everything but the RM's weights and optimizer that a restart needs (JSON-able)."""
        return {"version": self.version, "mode": self.mode, "counters": dict(self.counters), **self._group_state()}

    def pinned_models(self) -> dict:
        """{version: scoring module} of the versions older than the latest that open groups are pinned to."""
        return {v: self.scorer.model_of(v) for v in sorted(self.groups.versions_in_use()) if v != self.version}

    def _load_state(self, state: dict) -> None:
        self.counters.update(state.get("counters", {}))
        self._checkpointed_updates = self.counters["updates"]
        self.hacking.paying_rule = state.get("mode", self.mode) == "rule" and self.pay.source != "rule"
        self._load_groups(state, self.scorer.versions())

    async def _checkpoint(self) -> None:
        # Taken in the event loop (no request changes them meanwhile). The pinned modules are published copies
        # nobody trains; one retired meanwhile is reused only by `publish`, which runs on the same executor thread,
        # so after this save.
        state, pinned = self.state(), self.pinned_models()
        start = time.perf_counter()
        tag = await asyncio.get_running_loop().run_in_executor(self._executor, self.checkpointer.save, state, pinned)
        self._checkpointed_updates = state["counters"]["updates"]
        logger.info("checkpoint %s of RM version %d in %.1fs", tag, state["version"], time.perf_counter() - start)

    # -------------------------------------------------------------------------------------- metrics
    async def gauges(self) -> dict[str, float]:
        """Point-in-time numbers for /metrics and /health (`serve/contract.py`)."""
        stats = self.rm_batcher.stats
        return {"rm_version": float(self.version), "open_groups": float(len(self.groups.open)),
                "ready_groups": float(len(self.ready)), "groups_completed": float(self.groups.completed),
                "rm_queue": float(self.rm_batcher.queued), "verify_queue": float(self.verify_batcher.queued),
                "rm_batches": float(stats.batches),
                "rm_batch_mean": stats.items / stats.batches if stats.batches else 0.0,
                # time inside the batch functions: against wall time, how busy the RM and the verifier are
                "rm_busy_seconds": stats.busy_seconds, "verify_busy_seconds": self.verify_batcher.stats.busy_seconds,
                "update_in_flight": float(not self.update_done.is_set()), "paying_rule": float(self.mode == "rule"),
                STEP_FAILURES: float(self.step_failures), "learning_failing": float(self.step_error is not None),
                "groups_repinned": float(self.groups_repinned), **group_gauges(self.groups, self.group_warnings),
                **(getattr(self.learner, "health_gauges", dict)() if self.learner is not None else {}),
                **self._thread_choices(), **{k: float(v) for k, v in self.counters.items()}}

    def _thread_choices(self) -> dict[str, float]:
        """On CPU, the intra-op thread count each batch size runs with now (`runtime/cpu_threads.py`), by the
        smallest row count of its bucket: `rm_threads_rows_1` is a lone request's."""
        threads = getattr(self.scorer, "threads", None)
        return {f"rm_threads_rows_{rows}": float(count) for rows, count in threads.chosen().items()} if threads else {}
