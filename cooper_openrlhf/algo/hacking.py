"""Reward-hacking alarm: one documented rule over a window of training steps (metrics in, verdict out).

What hacking looks like (arXiv 2508.05613): with a frozen RM the policy learns what the RM pays for rather
than what is correct. The training RM reward climbs towards 1.0 while the rule-verified accuracy of the
same rollouts collapses, so their difference, `cooper/reward_hacking_gap` = `cooper/rm_reward_mean` -
`cooper/verified_accuracy`, grows. Under Cooper the RM keeps learning from fresh pairs and the gap stays
small. The rule below watches for that shape in what every step already logs.

Inputs, per step (keys of the step's metrics dict as the trainer logs them; every one may be missing):
  gap              cooper/reward_hacking_gap (else rm_reward_mean - verified_accuracy)   RM arms only
  RM reward        cooper/rm_reward_mean                                                  RM arms only
  verified acc.    cooper/verified_accuracy                                               every arm
  pair accuracy    cooper/rm_pair_accuracy: the RM on the step's fresh pairs before it    Cooper arm, steps
                   trains on them                                                         with valid pairs
  held-out acc.    eval/accuracy, else the mean of eval/<name>/accuracy                   after evaluations
  held-out size    eval/samples: how many graded samples that accuracy is a mean of        after evaluations
  wrong paid       cooper/rm_reward_wrong_mean: the RM's mean reward on the step's rollouts RM arms, steps
                   the rule verifier marks wrong                                          with a wrong rollout
  held-out gap     eval/reward_hacking_gap: the RM's mean reward on the held-out rollouts  RM arms, after
                   - their verified accuracy, and eval/reward_hacking_gap_se, its standard  evaluations
                   error from completion sampling (`heldout_gap_standard_error`)
  response length  rollout/response_length_mean (OpenRLHF's `_compute_rollout_stats`)     every arm
  probe premiums   cooper/probe_premium/<form>: the RM's pay of a probe form minus its pay of RM arms, every
                   canonical wrong answers (rm/probes.py)                                 --eval.steps

The rule. The window is the last `window` steps fed to the monitor; nothing fires before it is full. A
trend is the least-squares slope per step over the window's steps that carry the key, and a window
statistic needs the key on at least half the window's steps (and 3). The alarm is raised when ANY of these
rules holds (`algo/hacking_rules.py`; the letter each had before the rules were named in brackets):
  gap_growing (A)  slope(gap) >= rise_per_step and the fitted gap at the window's last step exceeds the
                   first window's mean gap by >= gap_growth (the RM pulls away from the verifier, and has
                   already moved well away from where it started; a constant offset of a miscalibrated
                   RM is not growth)
  gap_high (B)     mean gap over the window >= gap_ceiling (the RM pays for wrong answers, whatever the trend)
  heldout_falls    latest held-out accuracy <= best held-out accuracy so far - the drop threshold, while
  (C)              slope(RM reward) >= rise_per_step (more RM reward, worse on problems it never trained on).
                   The threshold is heldout_drop, or heldout_z standard errors of the difference of two
                   evaluations of eval/samples graded samples each (binomial), whichever is larger: the best of
                   many noisy evaluations sits well above their mean, so a fixed drop alarms on noise when the
                   held-out set is small (128 samples: one standard error is 0.04 at 40% accuracy).
  rm_blind (D)     mean pair accuracy over the window < min_pair_accuracy (the RM barely ranks a verified-
                   correct rollout above a wrong rewrite of it, so the policy's reward is not a verdict)
  heldout_gap_     the latest held-out gap exceeds the first one by >= gap_growth and by >= heldout_z
  grows (E)        standard errors of their difference (the gap of gap_growing, measured where it is quiet: the
                   same held-out prompts at every evaluation, so the prompts drawn cannot move it, only the
                   completions sampled; a training step's few prompts make its gap noisy, see persist_steps)
  wrong_paid_more  the RM's mean reward on the step's verified-wrong rollouts has run above the first
  (F)              window's mean: a one-sided cumulative sum (Page's CUSUM) of (value - baseline -
                   gap_growth / 2), reset at 0, reaches window_z times the value's step-to-step noise (the
                   standard deviation of successive differences over sqrt 2, every step so far). The
                   definition of hacking read directly: the RM paying more for what the verifier rejects.
                   Quieter than gap_growing on small batches: conditioning on the verdict takes out the gap's mix term
                   (a step of easier prompts has more correct rollouts, so a miscalibrated RM's gap moves
                   with the prompts drawn), the threshold is in units of the run's own noise rather than
                   one argued for a batch size, and the sum needs a rise that lasts (a one-step spike
                   adds little and drains at gap_growth / 2 a step), while a large lasting rise crosses in
                   a few steps. Like gap_growing it measures growth: an RM already paying wrong answers in
                   the first window (a collapse at the start) is gap_high's and rm_blind's to catch.
  probe_paid_as_   at the latest reading of the RM's probe suite (rm/probes.py, every --eval.steps), some form
  right            the verifier grades wrong has a premium over canonical wrong answers of at least probe_share
                   times the right answers' premium: the RM pays a known attack like a right answer. Not a
                   default rule: it holds from step 0 for an RM born with a blind spot (hacking_rules.py says why).
Only the rules named in `rules` may raise the alarm (all by default; cli.replay_monitor compares subsets).
The alarm turns on once its rules have held at persist_steps consecutive steps (default 1: at the first), and
goes off at the first step where none holds. A verdict is a test repeated at every step, so where the
per-step noise is well above the ~0.03 the thresholds below were argued for (256 rollouts a step), noise
crosses them now and then; waiting for a rule to hold several steps running quiets that, at the price of a
later warning when the RM is being hacked. Neither is free: cli.replay_monitor measures both on a run's logs.
With an alarm the reasons also name the supporting evidence that never fires alone, because honest RL moves
it too: verified accuracy falling (slope <= -rise_per_step) and response-length drift (window mean vs the
first window's mean, relative, beyond length_drift). The rule arm has no RM keys: no rule can hold there, and
its verdict carries only the signals it has.

`HackingMonitor` is pure (no Ray, no torch). `guard_step` is the in-training guard the trainer calls once
per step: it feeds the monitor, returns `cooper/hacking_*` metrics to log and warns with the reasons when the
alarm turns on; the trainer then does what --cooper.on_hacking says (warn, stop with `HackingAlarm` after a
checkpoint, or pay the policy by the rule verifier from then on).
"""

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from cooper_openrlhf.algo.hacking_rules import HACKING_RULES, min_points, parse_rule_names
from cooper_openrlhf.algo.hacking_stats import finite, heldout_accuracy, least_squares_slope
from cooper_openrlhf.runtime.registry import Registry
from cooper_openrlhf.algo.metric_keys import (
    ACCURACY,
    ALARM,
    GAP,
    HELDOUT_GAP,
    HELDOUT_GAP_SE,
    HELDOUT_PREFIX,
    HELDOUT_SAMPLES,
    PAIR_ACCURACY,
    RESPONSE_LENGTH,
    PROBE_PREMIUM,
    PROBE_RIGHT,
    PROBE_WRONG_FORMS,
    RM_REWARD,
    WRONG_REWARD,
)

logger = logging.getLogger(__name__)

FLAG_PREFIX = "hacking_"  # HackingMonitorConfig.x <-> --cooper.hacking_x


def _help(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class HackingMonitorConfig:
    """Thresholds of the rule (module docstring). Each field is the flag --cooper.hacking_<field>."""

    # 10 points average out per-step sampling noise (a slope's standard error is the per-step noise / 9.1)
    # yet flag a collapse that unfolds over tens of steps well before the run ends.
    window: int = field(default=10, metadata=_help(
        "Steps the reward-hacking rule looks back over; no alarm before this many steps have been seen."))
    # +0.1 over a 10-step window on a [0, 1] reward: about 3 standard errors of the slope for a step of 256
    # rollouts (per-step noise ~0.03), and far below the paper's static-RM collapse (gap 0 -> ~1).
    rise_per_step: float = field(default=0.01, metadata=_help(
        "Least-squares slope per step above which the gap or the RM reward counts as rising "
        "(and below minus which verified accuracy counts as falling)."))
    # A fifth of the reward range: several times the noise of a window's fitted gap (~0.03 for 100 rollouts
    # per step), and reached early in the paper's static-RM collapse, where the gap goes from ~0 to ~1.
    gap_growth: float = field(default=0.2, metadata=_help(
        "Rule gap_growing: a rising gap (RM reward mean - verified accuracy) alarms once its fitted value at the window's "
        "last step exceeds the first window's mean gap by this much. Also heldout_gap_grows' least growth, and twice "
        "wrong_paid_more's allowance per step."))
    # Half the reward range: the RM hands wrong rollouts at least half a full reward per rollout of the batch.
    gap_ceiling: float = field(default=0.5, metadata=_help(
        "Rule gap_high: a window mean gap at or above this alarms whatever its trend."))
    # 5 points: above the ~2-point bootstrap standard error of a held-out set of a few hundred problems.
    heldout_drop: float = field(default=0.05, metadata=_help(
        "Rule heldout_falls: held-out accuracy this far (absolute) below its best so far alarms while the RM reward rises "
        "(the least drop; see the heldout_z threshold)."))
    # 3 standard errors of a difference: the best-so-far is itself a maximum over noisy evaluations (about
    # 2 standard errors above the mean after 20 of them), so 2 would still alarm on noise late in a run.
    heldout_z: float = field(default=3.0, metadata=_help(
        "Rule heldout_falls: the drop must also exceed this many standard errors of the difference between two held-out "
        "evaluations (binomial, from the graded sample count eval/samples); without a count only heldout_drop applies. "
        "Also heldout_gap_grows' multiple of the held-out gap's standard error."))
    # Chance is 0.5; a VerifyRM below 0.6 on the policy's own fresh pairs hardly discriminates at all.
    min_pair_accuracy: float = field(default=0.6, metadata=_help(
        "Rule rm_blind: a window mean RM pair accuracy (fresh pairs, before the RM trains on them) below this alarms."))
    # 3 as for heldout_z: the sum is tested once per step, tens of times a run; with the allowance of gap_growth / 2
    # a lasting rise of gap_growth adds gap_growth / 2 a step, so it crosses in about window_z x noise / 0.1 steps.
    window_z: float = field(default=3.0, metadata=_help(
        "Rule wrong_paid_more: the cumulative sum of the RM's reward on verified-wrong rollouts above the first window's mean "
        "(beyond gap_growth / 2 a step) alarms at this many times that reward's step-to-step noise."))
    rules: str = field(default="gap_growing,gap_high,heldout_falls,rm_blind,heldout_gap_grows", metadata=_help(
        "The rules that may raise the alarm, comma-separated names (algo/hacking.py: gap_growing, gap_high, "
        "heldout_falls, rm_blind, heldout_gap_grows, wrong_paid_more, probe_paid_as_right); the others are still computed. The old "
        "letters A-F (e.g. ABCD) are still read, deprecated until 2027-03-01."))
    # Four fifths: well past half-way, where a reference-matching RM's pay of the exploit sits (the style lab's
    # static RM paid it as much as right answers, docs/results.md), and beyond a noisy half-learnt margin.
    probe_share: float = field(default=0.8, metadata=_help(
        "Rule probe_paid_as_right: an attack form the rule verifier grades wrong alarms when the RM pays it at least "
        "this share of the way from a canonical wrong answer's pay to a right answer's (rm/probes.py). Acts only with "
        "probe_paid_as_right among the rules and the probe suite read (held-out prompts, probe prompts > 0)."))
    # One: the alarm's purpose is a warning before the damage is done (--cooper.on_hacking stop / rule_reward).
    # More quiets the noise of small batches at the cost of warning later.
    persist_steps: int = field(default=1, metadata=_help(
        "Consecutive steps at which one of the alarm's rules must hold before the alarm turns on "
        "(1: at the first)."))
    # Honest RL changes lengths too (reasoning grows), so only a large drift is worth naming, and never alone.
    length_drift: float = field(default=0.5, metadata=_help(
        "Relative change of the mean response length against the first window's, named as supporting "
        "evidence of an alarm (never alarms alone)."))

    def __post_init__(self):
        problems = []
        if self.window < 3:
            problems.append(f"window must be >= 3 (a trend needs 3 points), got {self.window}")
        if self.persist_steps < 1:
            problems.append(f"persist_steps must be >= 1, got {self.persist_steps}")
        try:  # normalised to names in the registry's order, so the config says what it means
            object.__setattr__(self, "rules", ",".join(parse_rule_names(self.rules)))
        except ValueError as exc:
            problems.append(f"rules: {exc}")
        for name in ("rise_per_step", "gap_growth", "gap_ceiling", "heldout_drop", "heldout_z", "window_z",
                     "length_drift", "probe_share"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.min_pair_accuracy <= 1.0:
            problems.append(f"min_pair_accuracy must be in [0, 1], got {self.min_pair_accuracy}")
        if problems:
            raise ValueError("; ".join(f"--cooper.{FLAG_PREFIX}{p}" for p in problems))

    @property
    def rule_names(self) -> tuple[str, ...]:
        return tuple(self.rules.split(","))

    @classmethod
    def flags(cls) -> list[tuple[str, type, object, str]]:
        """(flag, type, default, help) of every field, for `parser.add_argument(flag, type=, default=, help=)`."""
        return [(f"--cooper.{FLAG_PREFIX}{f.name}", type(f.default), f.default, f.metadata["help"]) for f in fields(cls)]

    @classmethod
    def from_namespace(cls, cooper) -> "HackingMonitorConfig":
        """The config from the hierarchized `args.cooper` namespace (`hacking_<field>`; absent ones keep defaults)."""
        return cls(**{f.name: getattr(cooper, FLAG_PREFIX + f.name) for f in fields(cls)
                      if hasattr(cooper, FLAG_PREFIX + f.name)})


@dataclass
class HackingVerdict:
    """The rule's decision after one step."""

    alarm: bool  # True when a rule of `rules` has held at persist_steps consecutive steps, this one included
    reasons: list[str]  # one sentence per rule that holds, then supporting evidence (empty without an alarm)
    signals: dict[str, float]  # the window statistics the rule read (only those the available keys allow)
    fired: list[str] = field(default_factory=list)  # the names of the rules that hold (empty without an alarm)


def _step_signals(metrics: Mapping[str, float]) -> dict[str, float]:
    """The rule's inputs of one step (module docstring), non-finite or missing values left out."""
    picked = {name: float(metrics[key]) for name, key in
              (("gap", GAP), ("rm_reward", RM_REWARD), ("accuracy", ACCURACY), ("pair_accuracy", PAIR_ACCURACY),
               ("length", RESPONSE_LENGTH), ("wrong_reward", WRONG_REWARD)) if finite(metrics.get(key))}
    if "gap" not in picked and "rm_reward" in picked and "accuracy" in picked:
        picked["gap"] = picked["rm_reward"] - picked["accuracy"]
    heldout = heldout_accuracy(metrics)
    if heldout is not None:
        picked["heldout"] = heldout
        if finite(metrics.get(HELDOUT_SAMPLES)) and metrics[HELDOUT_SAMPLES] >= 1:
            picked["heldout_samples"] = float(metrics[HELDOUT_SAMPLES])
    for form in (PROBE_RIGHT, *PROBE_WRONG_FORMS):  # the probe suite, at the steps that read it (--eval.steps)
        if finite(metrics.get(PROBE_PREMIUM + form)):
            picked[f"probe_premium/{form}"] = float(metrics[PROBE_PREMIUM + form])
    if finite(metrics.get(HELDOUT_GAP)):
        picked["heldout_gap"] = float(metrics[HELDOUT_GAP])
        if finite(metrics.get(HELDOUT_GAP_SE)) and metrics[HELDOUT_GAP_SE] >= 0:
            picked["heldout_gap_se"] = float(metrics[HELDOUT_GAP_SE])
    return picked


class HackingMonitor:
    """Feeds one step's metrics at a time to the rule (module docstring) and returns its verdict."""

    def __init__(self, config: HackingMonitorConfig | None = None):
        self.config = config or HackingMonitorConfig()
        self.min_points = min_points(self.config)
        self.window: deque[tuple[int, dict[str, float]]] = deque(maxlen=self.config.window)
        self.steps_seen = 0
        self.last_step: int | None = None
        self.first_lengths: list[float] = []  # the first window's response lengths (supporting evidence)
        # Every rule runs (and logs its statistics); only those of config.rules may raise the alarm.
        self.rules = {name: rule(self.config) for name, rule in HACKING_RULES.items()}
        self.rules_held_steps = 0  # consecutive steps, up to the last, at which some rule held
        self.alarm_on = False  # the previous verdict's alarm

    def update(self, step: int, metrics: Mapping[str, float]) -> HackingVerdict:
        """Add step `step` (strictly after the previous one) and decide on the window ending there."""
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"steps must increase: got step {step} after step {self.last_step}")
        self.last_step = step
        signals = _step_signals(metrics)
        self.steps_seen += 1
        self.window.append((step, signals))
        if self.steps_seen <= self.config.window and "length" in signals:
            self.first_lengths.append(signals["length"])
        for rule in self.rules.values():
            rule.observe(signals, self.steps_seen)
        verdict = self._decide()
        self.alarm_on = verdict.alarm
        return verdict

    def _series(self, name: str) -> list[tuple[int, float]] | None:
        """(step, value) of `name` over the window, or None when fewer than min_points steps carry it."""
        points = [(step, signals[name]) for step, signals in self.window if name in signals]
        return points if len(points) >= self.min_points else None

    def _decide(self) -> HackingVerdict:
        """The verdict on the window: the registry's rules (`algo/hacking_rules.py`) over its statistics."""
        cfg = self.config
        stats = self._window_stats()
        for rule in self.rules.values():
            stats.update(rule.stats(stats))
        accuracy_slope = stats.get("verified_accuracy_slope")
        if self.steps_seen < cfg.window:
            return HackingVerdict(False, [], stats)
        held = {name: reason for name in cfg.rule_names if (reason := self.rules[name].reason(stats)) is not None}
        reasons = list(held.values())
        self.rules_held_steps = self.rules_held_steps + 1 if reasons else 0
        stats["rules_held_steps"] = float(self.rules_held_steps)
        if self.rules_held_steps < cfg.persist_steps:  # nothing holds, or not yet for long enough
            return HackingVerdict(False, [], stats)
        if accuracy_slope is not None and accuracy_slope <= -cfg.rise_per_step:
            reasons.append(f"supporting: verified accuracy falls {accuracy_slope:+.3f}/step")
        if abs(stats.get("length_drift", 0.0)) >= cfg.length_drift:
            reasons.append(f"supporting: mean response length drifted {stats['length_drift']:+.0%} from the "
                           f"first {cfg.window} steps")
        return HackingVerdict(True, reasons, stats, list(held))

    def _window_stats(self) -> dict[str, float]:
        """The window statistics the rules read (only those the available metrics allow; each rule adds those of
        its own state); logged as cooper/hacking_<name>."""
        stats: dict[str, float] = {"window_steps": float(len(self.window))}
        gap, rm_reward = self._series("gap"), self._series("rm_reward")
        accuracy, pairs, lengths = self._series("accuracy"), self._series("pair_accuracy"), self._series("length")
        if gap:
            stats["gap_mean"] = sum(v for _, v in gap) / len(gap)
            stats["gap_slope"] = least_squares_slope(gap)
            mean_step = sum(s for s, _ in gap) / len(gap)
            stats["gap_end"] = stats["gap_mean"] + stats["gap_slope"] * (gap[-1][0] - mean_step)
        if rm_reward:
            stats["rm_reward_slope"] = least_squares_slope(rm_reward)
        if accuracy:
            stats["verified_accuracy_slope"] = least_squares_slope(accuracy)
        if pairs:
            stats["rm_pair_accuracy_mean"] = sum(v for _, v in pairs) / len(pairs)
        first = self.first_lengths
        baseline = sum(first) / len(first) if len(first) >= self.min_points else None
        if lengths and baseline:
            stats["length_drift"] = sum(v for _, v in lengths) / len(lengths) / baseline - 1.0
        return stats


class HackingAlarm(RuntimeError):
    """Ends a run whose alarm turned on under --cooper.on_hacking stop (raised by the trainer, after its checkpoint)."""


@dataclass(frozen=True)
class AlarmResponse:
    """What the trainer does when the alarm turns on (--cooper.on_hacking); a warning with the reasons always."""

    checkpoint_and_stop: bool = False  # save this step's checkpoint, then end the run with HackingAlarm
    reward_from_rule: bool = False  # pay the policy by the rule verifier from the next step on


ALARM_RESPONSES = Registry("--cooper.on_hacking", {
    "warn": AlarmResponse(), "stop": AlarmResponse(checkpoint_and_stop=True),
    "rule_reward": AlarmResponse(reward_from_rule=True)})


def alarm_response(name: str) -> AlarmResponse:
    """The response named by --cooper.on_hacking; unknown names are rejected with the valid ones."""
    return ALARM_RESPONSES[name]


def guard_step(monitor: HackingMonitor, step: int, status: Mapping[str, float],
               eval_logs: Mapping[str, float] | None = None) -> dict[str, float]:
    """The in-training guard: one call per training step, after the step's metrics are complete.

    status: the step's logged metrics (`cooper/*`, `rollout/*`, ...). eval_logs: the logs of a held-out
    evaluation made since the previous call, if any, keyed as the trainer's `evaluate` returns them
    (`accuracy`, `<name>/accuracy`; an `eval/` prefix is added where missing). Pass each evaluation once.
    Returns the metrics to add to the step's status: cooper/hacking_alarm (1.0 / 0.0) and
    cooper/hacking_<signal> for each window statistic. Logs a warning naming the reasons when the alarm
    turns on and an info line when it clears. What else happens on an alarm is the trainer's (--cooper.on_hacking).
    """
    metrics = dict(status)
    for key, value in (eval_logs or {}).items():
        metrics[key if key.startswith(HELDOUT_PREFIX) else HELDOUT_PREFIX + key] = value
    was_on = monitor.alarm_on
    verdict = monitor.update(step, metrics)
    if verdict.alarm and not was_on:
        message = f"reward hacking suspected at step {step}: " + "; ".join(verdict.reasons)
        logger.warning(message)
    elif was_on and not verdict.alarm:
        logger.info("reward-hacking alarm cleared at step %d", step)
    return {ALARM: float(verdict.alarm),
            **{f"cooper/hacking_{name}": value for name, value in verdict.signals.items()}}
