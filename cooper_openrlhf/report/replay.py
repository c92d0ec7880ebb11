"""Re-judge logged runs with the reward-hacking rule: the alarm a run would have raised under other thresholds.

The in-training guard (`algo.hacking.guard_step`) sees each step's metrics once, as training goes. Every input
it reads is also in the run's tensorboard log, so the same `HackingMonitor` can be fed again afterwards, with
any `HackingMonitorConfig`, without training again: to try a threshold on runs that are already done, or to
check a changed rule against the runs that motivated it.

Runs logged before the trainer logged wrong_paid_more's input are judged on it too: `report.runs.load_run` takes it
from the run's rollout log.

Order, as in training: the trainer evaluates on the held-out set after a step's metrics are logged (OpenRLHF's
`save_logs_and_checkpoints`), so an evaluation logged at step s reaches the guard with step s + 1.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cooper_openrlhf.algo.hacking import HackingMonitor, HackingMonitorConfig, HackingVerdict
from cooper_openrlhf.algo.hacking_rules import HACKING_RULES
from cooper_openrlhf.algo.metric_keys import ACCURACY, GAP, HELDOUT_PREFIX, HELDOUT_SAMPLES, RM_REWARD, WRONG_REWARD
from cooper_openrlhf.report.aggregate import Scalars, alarm_steps, alarm_timing, heldout_series


@dataclass
class Replay:
    """One run re-judged: the verdict at every training step, and what the run itself logged."""

    verdicts: list[tuple[int, HackingVerdict]]
    logged_alarm_steps: list[int]  # steps whose logged cooper/hacking_alarm was on (what training saw)

    @property
    def alarm_steps(self) -> list[int]:
        return [step for step, verdict in self.verdicts if verdict.alarm]

    @property
    def rules(self) -> list[str]:
        """The names of the rules that raised an alarm at any step, in the registry's order."""
        fired = {name for _, verdict in self.verdicts for name in verdict.fired}
        return [name for name in HACKING_RULES if name in fired]


def replay_monitor(scalars: Scalars, config: HackingMonitorConfig,
                   heldout_samples: float | None = None) -> Replay:
    """Feed a run's logged scalars (metric -> [(step, value)], `train/` prefix dropped) to a fresh monitor.

    Training steps are the steps that carry any non-eval metric; `eval/*` values join the next training step.
    heldout_samples: graded samples per held-out evaluation, for runs logged before `eval/samples` existed
    (an evaluation's own `eval/samples` wins).
    """
    per_step: dict[int, dict[str, float]] = {}
    evals: dict[int, dict[str, float]] = {}
    for name, series in scalars.items():
        target = evals if name.startswith(HELDOUT_PREFIX) else per_step
        for step, value in series:
            target.setdefault(step, {})[name] = value
    monitor, verdicts, pending_eval = HackingMonitor(config), [], {}
    for step in sorted(set(per_step) | set(evals)):
        if pending_eval and heldout_samples and HELDOUT_SAMPLES not in pending_eval:
            pending_eval[HELDOUT_SAMPLES] = heldout_samples
        if step in per_step:
            verdicts.append((step, monitor.update(step, {**per_step[step], **pending_eval})))
            pending_eval = {}
        pending_eval.update(evals.get(step, {}))  # logged after this step's metrics: the guard sees it next step
    return Replay(verdicts, alarm_steps(scalars))


def gap_step_noise(scalars: Scalars) -> float | None:
    """The step-to-step noise of a run's gap (RM reward mean - verified accuracy): the standard deviation of
    successive differences over sqrt(2), which a slow trend hardly moves. The alarm's thresholds were argued
    for ~0.03 (256 rollouts a step, algo/hacking.py); a run far above that sees noise cross them.
    None with fewer than 3 steps carrying the gap."""
    gap = dict(scalars.get(GAP, []))
    if not gap:
        rewards, accuracy = dict(scalars.get(RM_REWARD, [])), dict(scalars.get(ACCURACY, []))
        gap = {step: rewards[step] - accuracy[step] for step in rewards.keys() & accuracy.keys()}
    values = [gap[step] for step in sorted(gap)]
    if len(values) < 3:
        return None
    diffs = [b - a for a, b in zip(values, values[1:])]
    mean = sum(diffs) / len(diffs)
    return math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / 2)


@dataclass
class WrongRewardCourse:
    """The course of what the RM paid verified-wrong rollouts over a run (`cooper/rm_reward_wrong_mean`), each a
    mean over `span` consecutive steps that carry it: at the start, at its highest (and that stretch's last step),
    at the end. With hindsight it says whether an alarm came during an episode the co-trained RM then closed
    (peak well above first, last back near it) or during one that lasted (last still high)."""

    first: float
    peak: float
    peak_step: int
    last: float

    def closed_episode(self, rise: float) -> bool:
        """The RM paid wrong rollouts >= `rise` above its start at some stretch and, by the end, no more than
        rise / 2 above it: an episode of hacking that training closed (under Cooper, the co-trained RM)."""
        return self.peak >= self.first + rise and self.last <= self.first + rise / 2


def wrong_reward_course(scalars: Scalars, span: int = 5) -> WrongRewardCourse | None:
    """`WrongRewardCourse` of a run, or None when fewer than `span` steps carry the key."""
    points = scalars.get(WRONG_REWARD, [])
    if span < 1 or len(points) < span:
        return None
    means = [(points[i + span - 1][0], sum(v for _, v in points[i:i + span]) / span)
             for i in range(len(points) - span + 1)]
    peak_step, peak = max(means, key=lambda point: point[1])
    return WrongRewardCourse(means[0][1], peak, peak_step, means[-1][1])


@dataclass
class AlarmOutcome:
    """What an alarm did for one run, judged by the run's held-out accuracy (the thing the alarm protects)."""

    held: bool | None  # last held-out accuracy >= the level asked for (None: no held-out evaluation)
    first_alarm: int | None
    lowest_step: int | None  # the first step of the lowest held-out accuracy
    fall_done: float | None  # share of the fall (first -> lowest held-out) already behind when the alarm came,
    # measured at the lowest evaluation before the alarm: a run that bottomed out and recovered before its alarm
    # had its whole fall behind it, however high it stood when the alarm came

    @property
    def early(self) -> bool:
        """Alarmed before half of the run's fall was done (the warning still saves something)."""
        return self.fall_done is not None and self.fall_done < 0.5


def alarm_outcome(scalars: Scalars, alarm_at: Sequence[int], held_at: float) -> AlarmOutcome:
    """The outcome of alarms at steps `alarm_at` on a run (`alarm_timing`: the alarm at step s had seen the
    evaluations logged before s), so fall_done is (first - the lowest of those) / (first - lowest); 0 when the
    alarm came before any evaluation, None without an alarm or a fall."""
    timing, heldout = alarm_timing(scalars, alarm_at), heldout_series(scalars)
    first_alarm = alarm_at[0] if alarm_at else None
    if not heldout:
        return AlarmOutcome(None, first_alarm, None, None)
    fall, fall_done = timing.first - timing.lowest, None
    if first_alarm is not None and fall > 0:
        seen = timing.first if timing.lowest_before_alarm is None else timing.lowest_before_alarm
        fall_done = max(0.0, (timing.first - seen) / fall)
    return AlarmOutcome(heldout[-1][1] >= held_at, first_alarm, timing.lowest_step, fall_done)
