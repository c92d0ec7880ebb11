"""Pure aggregation of runs into what the figures and tables show: per-arm bands over seeds, summaries.

Nothing here reads files or draws: series in ({metric: [(step, value)]} per run, see report/runs.py),
numbers out.
  band            one arm's curve: at each step the mean over the seeds that logged it, and min / max
  heldout_series  held-out accuracy per eval step: eval/accuracy, else the mean of eval/<name>/accuracy
  summarize_arm   final and best accuracy per seed -> mean +- std over seeds; held-out when every seed
                  has it, else the training rollouts' verified accuracy, labelled as such
  stage_seconds   `timing/*` per stage (without OpenRLHF's `timing/step_total`, their sum), pipeline order
  alarm_steps     steps where the reward-hacking guard logged cooper/hacking_alarm = 1
  hacking_signature  the issue's signature of one RM run: RM reward up, held-out accuracy down, below rule's
"""

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from cooper_openrlhf.algo.hacking_stats import least_squares_slope
from cooper_openrlhf.report.seed_stats import bootstrap_mean_interval, final_value, newey_west_slope_se
from cooper_openrlhf.algo.metric_keys import ACCURACY, ALARM, HELDOUT, HELDOUT_PREFIX, HELDOUT_SUFFIX, RM_REWARD

Series = list[tuple[int, float]]
Scalars = dict[str, Series]

TIMING_PREFIX, STEP_TOTAL = "timing/", "timing/step_total"
# The order stages run in within one step (ray/trainer.py and OpenRLHF's fit); others follow alphabetically.
STAGE_ORDER = ("generation", "cooper_decode", "cooper_verify", "cooper_negatives", "cooper_score", "make_experience",
               "ppo_train", "broadcast", "cooper_rm_update", "cooper_rm_read")
HELDOUT_LABEL = "held-out accuracy"
VERIFIED_LABEL = "verified accuracy of training rollouts (no held-out evaluation)"


@dataclass
class Band:
    """One arm's curve over seeds."""

    steps: list[int]  # every step any seed logged, ascending
    mean: list[float]  # (len(steps),) mean over the seeds that logged the step
    low: list[float]  # min over those seeds
    high: list[float]  # max over those seeds
    seeds: list[int]  # (len(steps),) how many seeds logged the step


@dataclass
class ArmSummary:
    """Final and best accuracy of one arm, mean +- std over its seeds."""

    arm: str
    metric: str  # HELDOUT_LABEL or VERIFIED_LABEL
    seeds: int
    final_mean: float
    final_std: float | None  # sample std (n - 1); None with a single seed
    best_mean: float
    best_std: float | None
    final_values: list[float]  # per seed, in the order given
    best_values: list[float]
    final_interval: tuple[float, float] = (math.nan, math.nan)  # 95% bootstrap interval of final_mean over seeds


def band(series: Sequence[Series]) -> Band:
    """Mean and min-max over the seeds' series, at each step any of them logged."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for points in series:
        for step, value in points:
            by_step[step].append(value)
    steps = sorted(by_step)
    return Band(steps, [statistics.fmean(by_step[s]) for s in steps], [min(by_step[s]) for s in steps],
                [max(by_step[s]) for s in steps], [len(by_step[s]) for s in steps])


def trailing_mean(points: Series, window: int) -> Series:
    """Each point replaced by the mean of it and the window - 1 logged points before it (fewer at the start)."""
    values = [value for _, value in points]
    return [(step, statistics.fmean(values[max(0, i - window + 1) : i + 1])) for i, (step, _) in enumerate(points)]


def smoothed_band(series: Sequence[Series], window: int = 1) -> Band:
    """The arm's curve as the figures draw it: each seed's series smoothed by a trailing mean over `window` logged
    points, then the mean over seeds at each step and a band of one standard error over them (mean only with one
    seed at a step). Per-step values of a few-prompt batch swing by several points; the smoothing shows the trend,
    the standard error how far the seeds' mean can be trusted (a min-max band only grows with the seeds drawn)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for points in series:
        for step, value in trailing_mean(sorted(points), window):
            by_step[step].append(value)
    steps = sorted(by_step)
    means = [statistics.fmean(by_step[s]) for s in steps]
    errors = [statistics.stdev(by_step[s]) / len(by_step[s]) ** 0.5 if len(by_step[s]) > 1 else 0.0 for s in steps]
    return Band(steps, means, [m - e for m, e in zip(means, errors)], [m + e for m, e in zip(means, errors)],
                [len(by_step[s]) for s in steps])


def heldout_series(scalars: Scalars) -> Series:
    """Held-out accuracy per eval step: eval/accuracy, else the mean of the eval/<name>/accuracy keys there."""
    if scalars.get(HELDOUT):
        return list(scalars[HELDOUT])
    by_step: dict[int, list[float]] = defaultdict(list)
    for key, points in scalars.items():
        if key.startswith(HELDOUT_PREFIX) and key.endswith(HELDOUT_SUFFIX):
            for step, value in points:
                by_step[step].append(value)
    return [(step, statistics.fmean(values)) for step, values in sorted(by_step.items())]


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def summarize_arm(arm: str, runs: Sequence[Scalars]) -> ArmSummary | None:
    """Final (the mean of the last FINAL_EVALUATIONS logged values: one held-out evaluation of a hundred samples
    is noisy) and best (max over steps) accuracy per seed, then mean +- std and a bootstrap interval over seeds.

    Held-out accuracy when every seed evaluated, else verified accuracy (labelled); seeds logging neither
    are left out; None when no seed logged either.
    """
    heldout = [heldout_series(scalars) for scalars in runs]
    if heldout and all(heldout):
        metric, curves = HELDOUT_LABEL, heldout
    else:
        metric, curves = VERIFIED_LABEL, [scalars.get(ACCURACY, []) for scalars in runs]
    curves = [curve for curve in curves if curve]
    if not curves:
        return None
    finals, bests = [final_value(curve) for curve in curves], [max(v for _, v in curve) for curve in curves]
    final_mean, final_std = _mean_std(finals)
    best_mean, best_std = _mean_std(bests)
    return ArmSummary(arm, metric, len(curves), final_mean, final_std, best_mean, best_std, finals, bests,
                      bootstrap_mean_interval(finals))


def stage_seconds(scalars: Scalars) -> dict[str, Series]:
    """{stage: [(step, seconds)]} of the `timing/*` keys except their sum, in pipeline order (STAGE_ORDER)."""
    stages = {key[len(TIMING_PREFIX):]: points for key, points in scalars.items()
              if key.startswith(TIMING_PREFIX) and key != STEP_TOTAL}
    known = [s for s in STAGE_ORDER if s in stages]
    return {stage: stages[stage] for stage in known + sorted(set(stages) - set(known))}


def alarm_steps(scalars: Scalars) -> list[int]:
    """Steps where the hacking guard raised the alarm (cooper/hacking_alarm >= 0.5)."""
    return [step for step, value in scalars.get(ALARM, []) if value >= 0.5]


@dataclass
class AlarmTiming:
    """Did the alarm come before the held-out accuracy bottomed out? (the lab's target for the static arm)"""

    first: float | None  # first held-out evaluation
    at_first_alarm: float | None  # the latest evaluation the guard had seen when it first alarmed (logged before it)
    lowest_before_alarm: float | None  # the lowest of the evaluations logged before the first alarm
    lowest: float | None
    lowest_step: int | None  # the first step where the lowest value was logged


def alarm_timing(scalars: Scalars, alarms: Sequence[int] | None = None) -> AlarmTiming:
    """Held-out accuracy first, when the alarm first fired, and at its lowest (None where it does not apply).

    alarms: the alarm steps (default: those the run logged; a replay passes its own). An evaluation logged at
    step s reaches the in-training guard with step s + 1, so the value "at the first alarm" is the last one
    logged strictly before the alarm's step.
    """
    heldout = heldout_series(scalars)
    alarms = alarm_steps(scalars) if alarms is None else alarms
    if not heldout:
        return AlarmTiming(None, None, None, None, None)
    lowest_step, lowest = min(heldout, key=lambda point: (point[1], point[0]))
    seen = [value for step, value in heldout if alarms and step < alarms[0]]
    return AlarmTiming(heldout[0][1], seen[-1] if seen else None, min(seen) if seen else None, lowest, lowest_step)


def value_at(series: Series, step: int) -> float | None:
    """The series' value at `step`, or None."""
    return next((value for s, value in series if s == step), None)


SIGNATURE_WINDOW = 5  # steps averaged at each end of the RM reward curve, to show where it started and ended
SIGNATURE_Z = 2.0  # the RM reward rises when its least-squares slope exceeds this many standard errors


@dataclass
class Signature:
    """The paper's hacking signature in one run: the RM's reward rises while held-out accuracy falls, ending below
    the rule-reward arm's. `shows` is None where it cannot be judged (no RM reward, no held-out curve, no rule arm)."""

    rm_first: float | None  # mean RM reward over the first SIGNATURE_WINDOW logged steps
    rm_last: float | None  # ... over the last ones
    rm_change: float | None  # the least-squares line's rise from the first logged step to the last
    rm_change_se: float | None  # its standard error, from the residuals about the line
    rm_rises: bool | None  # rm_change > SIGNATURE_Z * rm_change_se
    heldout_first: float | None
    heldout_last: float | None
    rule_final: float | None  # the rule arm's mean final held-out accuracy, as given
    shows: bool | None


def _line_rise(points: Series) -> tuple[float, float]:
    """The least-squares line's rise from the first point's step to the last, and its standard error: Newey-West's,
    since a training curve's consecutive steps are correlated and the plain error, which treats them as
    independent, calls a slow wander a rise (report/seed_stats.py)."""
    span = points[-1][0] - points[0][0]
    return least_squares_slope(points) * span, newey_west_slope_se(points) * span


def hacking_signature(scalars: Scalars, rule_final: float | None) -> Signature:
    """Does the run show the signature? RM reward up (the least-squares line over every logged step rises by more
    than SIGNATURE_Z standard errors: a trend, which the two ends' window means alone would miss or fake when one
    step's batch is small and noisy), final held-out accuracy below the first evaluation, and below `rule_final`
    (the rule arm's mean final)."""
    points = scalars.get(RM_REWARD, [])
    heldout = heldout_series(scalars)
    rm_first = rm_last = change = change_se = rises = None
    if len(points) >= max(3, 2 * SIGNATURE_WINDOW):
        values = [value for _, value in points]
        rm_first, rm_last = statistics.fmean(values[:SIGNATURE_WINDOW]), statistics.fmean(values[-SIGNATURE_WINDOW:])
        change, change_se = _line_rise(points)
        rises = change > SIGNATURE_Z * change_se
    first, last = (heldout[0][1], heldout[-1][1]) if len(heldout) >= 2 else (None, None)
    judged = rises is not None and first is not None and rule_final is not None
    return Signature(rm_first, rm_last, change, change_se, rises, first, last, rule_final,
                     bool(rises and last < first and last < rule_final) if judged else None)
