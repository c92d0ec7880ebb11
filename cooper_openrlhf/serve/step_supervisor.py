"""What the one-process service (`serve/service.py`) and the replicated service's group registry
(`serve/replicated/registry.py`) share about steps and the trainer's groups: the trainer-group checks (warnings,
never refusals: serve/trainer_groups.py), the groups a step leaves out, and the supervised step loop (expire,
then run each complete step, one at a time; nothing a step raises ends the loop).

A step is `groups_per_update` complete groups and one RM update: a synchronous trainer's step. Three things keep
the service's steps aligned with the trainer's when a real run is not:
- a step leaves out the groups whose (prompt, label) another group holds at the same RM version (one trainer
  group split over two of ours: n > group size, or a prompt twice in a trainer step): learned from, they would make
  the update land mid-step, and the rest of the trainer's group would be scored by the next version;
- complete groups left over when the trainer's step ends with fewer than `groups_per_update` of them (an episode's
  partial last step, the end of a run) form a step of their own, so the trainer's next step starts a fresh one. The
  trainer's step is over when no sample has come for `partial_step_after_s`, or sooner, when a sample comes whose
  prompt is one of theirs (a synchronous trainer sends a prompt once a step: the next episode re-sends it; but not
  a retry, a sample identical to a recorded answer of theirs while another group of the step still takes samples:
  a synchronous trainer, the default, sends its next step only once every answer of this one is in, so that is a
  200 lost on the way back, answered again from the record), or after
  `STEP_GAP_S` of quiet with every group complete but strays (no sample for `partial_step_after_s`: a request by
  hand, a retry's group): the trainer updated its policy and began its next step. The step boundary is found before
  that sample is placed, and the trainer's next step's new groups wait for that step's update. (A trainer whose
  steps are quicker than `STEP_GAP_S` and whose next step has none of the partial step's prompts makes one step of
  them and its next step's first groups: every group is still learned from, some a version earlier than the rest of
  their trainer step.) Groups still open after `partial_step_after_s` do not hold it back: a synchronous trainer
  between steps has no sample in flight, so they are left over from before (a retry, a restart) and complete with
  nothing of this step. (A trainer step whose last samples come more than that after all others gets two updates
  instead of one.);
- complete groups waiting for a step are bounded (`MAX_READY_STEPS` steps' worth: a learner that cannot keep
  up or keeps failing): the oldest are dropped, counted.
Every group left out is counted by reason (`groups.dropped`) and shown at /health and /metrics.

A class using it has `config` (a `ServiceConfig`), `groups` (a `GroupTracker`), `ready` (complete groups not yet
in a step), `version` (the RM version it publishes), `update_done` (an asyncio.Event, set while no update is in
flight), `_waited` (seconds new groups waited for updates), `step_error`, `step_failures`, `_step_wakeup` (an
asyncio.Event), calls `_init_group_checks()`,
`_arrived()` before placing a request's samples and `_recorded(complete)` after recording each, and defines
`_steps_done()`, `_expire_and_retire()` and `async _run_step(index, groups)`.
"""

import asyncio
import logging
import time

from cooper_openrlhf.serve.published_names import FAILED_STEP, OPEN_AT_STEP_END
from cooper_openrlhf.serve.trainer_groups import (WARNING_KINDS, GroupWarnings, no_group_completes,
                                                  open_when_a_step_completes, samples_by_prompt, shared_keys,
                                                  too_many_open)

logger = logging.getLogger(__name__)

MAX_READY_STEPS = 4  # complete groups kept waiting for the learner, in steps
CHECK_EVERY_S = 1.0  # invariant (1) is read at most this often (it walks the open groups)
LOOP_TICK_S = 5.0  # the step loop looks at expiry and quiet at least this often
# Quiet, with every group complete, that ends a trainer's step: its policy update between steps is longer (seconds
# on a GPU), while a step's samples, all generated at once, come closer together.
STEP_GAP_S = 3.0


DROP_REASONS = ("timeout", "silence", "split trainer group", "backlog", "learner crash")


def group_gauges(groups, warnings) -> dict[str, float]:
    """/metrics numbers of the groups: dropped from learning by reason, repeats answered (`samples_retried`: those
    counted in no group, so samples answered minus retried is the samples of the trainer's steps), the answers kept
    for retries (`retry_answers_kept`, at most --retry-record), warnings by kind."""
    dropped = {f"groups_dropped_{reason.replace(' ', '_')}": float(groups.dropped[reason]) for reason in DROP_REASONS}
    warned = {f"group_warnings_{kind.replace(' ', '_').replace(chr(39), '')}": float(warnings.counts[kind])
              for kind in WARNING_KINDS}
    return {**dropped, "groups_expired": float(groups.expired), "samples_repeated": float(groups.repeats),
            "samples_retried": float(groups.retries), "retry_answers_kept": float(groups.answers_kept), **warned}


def step_summary(index: int, metrics: dict, seconds: float) -> str:
    """The one log line of a step: version, pairs, loss, the RM's health on its anchors, seconds."""
    def value(key: str, form: str) -> str:
        return form.format(metrics[key]) if key in metrics else "-"

    return (f"step {index}: RM version {value('cooper/rm_version_after', '{:.0f}')}, "
            f"{value('cooper/rm_valid_pairs', '{:.0f}')} pairs, loss {value('cooper/rm_loss', '{:.4f}')}, "
            f"anchor AUC {value('cooper/rm_health/auc', '{:.3f}')}, samples {value('cooper/samples', '{:.0f}')}, "
            f"{seconds:.1f}s")


class StepSupervisor:
    def _init_group_checks(self) -> None:
        self.group_warnings = GroupWarnings(self.groups.clock)
        self._samples_since_complete = 0
        self._checked_at = -float("inf")
        self._split: set = set()  # (key, version) of trainer groups split over two of ours, not learned from
        self._step_end: list = []  # the groups of a trainer step found over by a sample's arrival, for the next step
        self._step_end_learned: asyncio.Future | None = None  # done once their step ran: new groups wait for it

    # ------------------------------------------------------------------------------------ placing
    async def _wait_for_update(self, key: tuple[str, str]) -> None:
        """A sample that opens a new group waits while an RM update is in flight, or while the step of a trainer
        step found over at its arrival has not run yet, so the trainer's next step is scored by the updated RM (as
        it would be, if its sample had come a moment later). `key`: the sample's
        (prompt, label); a sample joining its key's filling group never waits."""
        if not self.config.wait_for_update or self.groups.has_filling_group(*key):
            return
        step_end = self._step_end_learned
        if (step_end is None or step_end.done()) and self.update_done.is_set():
            return
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.config.update_wait_timeout_s):
                if step_end is not None and not step_end.done():
                    await asyncio.shield(step_end)
                await self.update_done.wait()
        except TimeoutError:
            logger.warning("a new group waited %.0fs for the RM update; scoring it with version %d",
                           self.config.update_wait_timeout_s, self.version)
        self._waited += time.perf_counter() - start

    def _identical_answer(self, sample_fingerprint: bytes):
        """The recorded answer (`groups.Answered`) of a sample identical to one answered before, counted in its
        group while that is open (a repeat); None for a sample to place and score (serve/groups.py)."""
        known = self.groups.answered(sample_fingerprint)
        if known is not None:
            self._repeated(self.groups.repeat(known))
        return known

    def _repeated(self, complete) -> None:
        """After a repeat is counted; `complete`: the group it completed, or None (a host may add to it)."""
        self._recorded(complete)

    # ------------------------------------------------------------------------------ trainer groups
    def _arrived(self, keys: list[tuple[str, str]], fingerprints: list[bytes] | None = None) -> None:
        """Before a request's samples are placed (`keys`: their (prompt, label), held-out ones left out;
        `fingerprints`: theirs, `groups.fingerprint`): the silence rule (`serve/groups.py`), then the step boundary
        (module docstring). Fewer than `groups_per_update` groups are ready, and either a sample's prompt is one of
        theirs again at the same RM version (a synchronous trainer sends a prompt once a step: this is its next step,
        or next episode) and the sample is not a retry of their answers while the step's other groups still take
        samples, or the sample comes after `STEP_GAP_S` of quiet with every group complete but strays: those groups
        are the trainer's last step's, and they form a step before this sample is placed."""
        quiet = self.groups.idle_s()
        self.groups.arrived()
        per_step, after_s = self.config.groups_per_update, self.config.partial_step_after_s
        if self._step_end or not (per_step and self.ready and len(self.ready) < per_step):
            return  # (a trainer step found over still waits for the step loop: its groups and waiters stay as they are)
        # (an asynchronous trainer may send its next step while this one's groups fill: an identical text may be new)
        if fingerprints is not None and self.config.wait_for_update and not self._only_strays_open(after_s):
            keys = [key for key, fp in zip(keys, fingerprints) if not self._retry_of_complete(fp)]
        if self._prompt_again(keys):
            why = "a prompt of theirs came again"
        elif quiet >= min(STEP_GAP_S, after_s) and self._only_strays_open(after_s):
            why = f"a sample came after {quiet:.0f}s of quiet, every group complete"
        else:
            return
        self._step_end, self.ready = self.ready, []
        self.groups.step_formed()
        try:
            self._step_end_learned = asyncio.get_running_loop().create_future()
        except RuntimeError:  # no event loop (unit tests drive the bookkeeping alone)
            self._step_end_learned = None
        self._step_wakeup.set()
        logger.info("a partial step of %d groups (%s: the trainer's step is over, an episode's partial last step)",
                    len(self._step_end), why)

    def _prompt_again(self, keys: list[tuple[str, str]]) -> bool:
        """Whether a key of `keys` has a ready group at the version a new group of it would get (and none filling)."""
        ready = {group.key for group in self.ready if group.version == self.version}
        return any(key in ready and not self.groups.has_filling_group(*key) for key in keys)

    def _retry_of_complete(self, sample_fingerprint: bytes) -> bool:
        """Whether a sample is identical to a recorded answer of a complete group that it may still retry
        (`groups.answered`): answered again, counted in no group."""
        known = self.groups.answered(sample_fingerprint)
        return known is not None and known.group_id not in self.groups.open

    def _only_strays_open(self, after_s: float) -> bool:
        """Whether every open group went without a sample for `after_s` (a request by hand, a retry's group): none
        of them is a group of this step still waiting for its last samples."""
        now = self.groups.clock()
        return all(now - group.last_at >= after_s for group in self.groups.open.values())

    def _recorded(self, complete) -> None:
        """After one sample is recorded; `complete`: the group it completed, or None."""
        if complete is None:
            self._samples_since_complete += 1
            return
        self._samples_since_complete = 0
        self.ready.append(complete)
        self._check_nothing_open_at_step_end()

    def _check_open_groups(self) -> None:
        """Invariant (1) of serve/trainer_groups.py, at most once every CHECK_EVERY_S."""
        now = self.groups.clock()
        if not (self.config.check_groups and self.config.groups_per_update) or now - self._checked_at < CHECK_EVERY_S:
            return
        self._checked_at = now
        self.group_warnings.note("too many open", too_many_open(
            [(g.prompt, g.reserved) for g in self.groups.open.values()], self.config.group_size,
            self.config.groups_per_update))

    def _check_nothing_open_at_step_end(self) -> None:
        """Invariant (2), when a group completes a step: a synchronous trainer's step completes with its last
        sample, so no other group is open then. Steps can queue up (a learner restarting), so it is read when
        a step's last group completes, not at every completion after."""
        per_step = self.config.groups_per_update
        if not (self.config.check_groups and self.config.wait_for_update and per_step) \
                or not self.ready or len(self.ready) % per_step:
            return
        others = [(g.prompt, g.reserved) for g in self.groups.open.values()]
        counts = samples_by_prompt([*self.ready, *self.groups.open.values()], self.ready[-1].version)
        self.group_warnings.note(OPEN_AT_STEP_END,
                                 open_when_a_step_completes(others, counts, self.config.group_size, per_step))

    @property
    def groups_status(self) -> str:
        """What /health says of the groups: "ok" or "warning: <cause and fix>"."""
        return self.group_warnings.status

    @property
    def learning_status(self) -> str:
        """What /health says of learning: "ok", or "failing: <why>" while steps fail or no group completes."""
        if self.step_error is not None:
            return f"failing: {self.step_error}"
        per_step, size = self.config.groups_per_update, self.config.group_size
        if self.config.check_groups and per_step and self._samples_since_complete >= 2 * per_step * size:
            return "failing: " + no_group_completes(self._samples_since_complete, size, per_step,
                                                    len(self.groups.open))
        return "ok"

    # --------------------------------------------------------------------------------------- steps
    def _next_step(self) -> list | None:
        """The next step's groups (module docstring), or None when none is due."""
        per_step = self.config.groups_per_update
        if self._step_end:  # found over at a sample's arrival (`_arrived`), which counted the step formed
            batch, self._step_end = self._step_end, []
            return self._learned_from(batch)
        if not per_step or not self.ready:
            return None
        if len(self.ready) > MAX_READY_STEPS * per_step:
            backlog = len(self.ready) - MAX_READY_STEPS * per_step
            self.groups.drop(self.ready[:backlog], "backlog")
            logger.warning("%d complete groups waited longer than %d steps for the learner; the oldest %d are dropped "
                           "from learning", len(self.ready), MAX_READY_STEPS, backlog)
            self.ready = self.ready[backlog:]
        if len(self.ready) >= per_step:
            batch, self.ready = self.ready[:per_step], self.ready[per_step:]
        elif self.groups.idle_s() >= self.config.partial_step_after_s:
            batch, self.ready = self.ready, []
            logger.info("a partial step of %d groups (no sample for %.0fs: the trainer's step is over, an episode's "
                        "partial last step or the run's end)", len(batch), self.config.partial_step_after_s)
        else:
            return None
        self.groups.step_formed()
        return self._learned_from(batch)

    def _learned_from(self, batch: list) -> list:
        """The groups of `batch` a step learns from: those not split with another group (module docstring)."""
        self._split |= shared_keys(batch, [*self.ready, *self.groups.open.values()])
        split = [g for g in batch if (g.key, g.version) in self._split]
        if split:
            self.groups.drop(split, "split trainer group")
            self.group_warnings.note("split trainer group", f"{len(split)} groups of a step share their prompt with "
                                     f"another group at the same RM version (the trainer sends more samples per prompt "
                                     f"than --group-size {self.config.group_size}, or a step holds a prompt twice): "
                                     f"they are not learned from")
        versions = {g.version for g in batch}
        self._split = {(key, version) for key, version in self._split if version >= min(versions)}
        # in the order their first samples arrived, which is the trainer's prompt order: its pairs are in that order
        return sorted((g for g in batch if (g.key, g.version) not in self._split),
                      key=lambda g: g.arrivals[0] if g.arrivals else -1)

    async def _step_loop(self) -> None:
        """Turn complete groups into steps, one at a time, and expire stale groups; a failure is logged, counted
        and shown (`_step_failed`), and the next step tries again."""
        while True:
            try:
                # while groups are open, the throttled check of open groups runs within CHECK_EVERY_S of the last one
                tick = CHECK_EVERY_S if self.groups.open or self.ready else LOOP_TICK_S
                async with asyncio.timeout(tick):  # not wait_for: on 3.11 it can swallow a cancellation
                    await self._step_wakeup.wait()
            except TimeoutError:
                pass
            self._step_wakeup.clear()
            try:
                self._expire_and_retire()
                self._check_open_groups()
            except Exception as exc:
                self._step_failed("expiring groups", exc)
            while True:
                # the waiters of a trainer step found over (`_arrived`) go on once its step ran (`_next_step` takes it)
                step_end = self._step_end_learned if self._step_end else None
                batch = self._next_step()
                if batch is None:
                    break
                # (empty: every group of it left out, counted: no update; the trainer's next step is scored as this)
                if batch:
                    index = self._steps_done()
                    try:
                        await self._run_step(index, batch)
                    except Exception as exc:
                        self._step_failed(FAILED_STEP.format(index=index), exc)
                    else:
                        self.step_error = None
                if step_end is not None and not step_end.done():
                    step_end.set_result(None)  # the next step's new groups go on (`_wait_for_update`)

    def _step_failed(self, what: str, exc: Exception) -> None:
        logger.error("%s failed; the next step tries again", what, exc_info=exc)
        self.step_failures += 1
        self.step_error = f"{what}: {type(exc).__name__}: {exc}"
