"""The reward-hacking rules, each named for what it detects, in a registry (`HACKING_RULES`).

A rule is a small class that owns everything about it: `observe` keeps its running state from each step's signals
(held-out accuracy's best, the first held-out gap, the wrong-rollout CUSUM; most rules need none), `stats` adds the
statistics it derives from that state to the window's (logged as cooper/hacking_<name>), and `reason` returns the
sentence naming why it holds, or None. Adding a rule is one class here, registered under its name. What each rule
means and why its thresholds are what they are: the module docstring of `algo/hacking.py`.

Before the rules had names they were letters; `--cooper.hacking_rules ABCD` (old commands and run configs) still
parses, through `LETTERS`, with a deprecation warning naming the date they stop (`LETTERS_REMOVED`).
"""

import logging
import math
import statistics
from collections.abc import Mapping

from cooper_openrlhf.runtime.registry import Registry

logger = logging.getLogger(__name__)

Stats = Mapping[str, float]


def min_points(cfg) -> int:
    """Steps of the window that must carry a key before a window statistic of it exists (half the window, >= 3)."""
    return max(3, math.ceil(cfg.window / 2))


class HackingRule:
    """One rule. cfg: the `HackingMonitorConfig` (thresholds)."""

    def __init__(self, cfg):
        self.cfg = cfg

    def observe(self, signals: Stats, steps_seen: int) -> None:
        """Fold in one step's signals (`steps_seen` counts it); a rule without running state ignores them."""

    def stats(self, window: Stats) -> dict[str, float]:
        """Statistics of this rule's own state, given the window's; logged beside them."""
        return {}

    def reason(self, s: Stats) -> str | None:
        """Why the rule holds over the statistics `s` (the window's and every rule's), or None."""
        raise NotImplementedError


HACKING_RULES: Registry[type[HackingRule]] = Registry("hacking rule")


@HACKING_RULES.register("gap_growing")
class GapGrowing(HackingRule):
    """The gap rises, and has moved well away from the first window's."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.first_window: list[float] = []

    def observe(self, signals, steps_seen):
        if steps_seen <= self.cfg.window and "gap" in signals:
            self.first_window.append(signals["gap"])

    def stats(self, window):
        if "gap_end" not in window or len(self.first_window) < min_points(self.cfg):
            return {}
        baseline = sum(self.first_window) / len(self.first_window)
        return {"gap_baseline": baseline, "gap_growth": window["gap_end"] - baseline}

    def reason(self, s):
        cfg = self.cfg
        if "gap_growth" in s and s["gap_slope"] >= cfg.rise_per_step and s["gap_growth"] >= cfg.gap_growth:
            return (f"gap_growing: RM reward - verified accuracy rises {s['gap_slope']:+.3f}/step over the last "
                    f"{s['window_steps']:.0f} steps to {s['gap_end']:.2f}, {s['gap_growth']:+.2f} from the first "
                    f"{cfg.window} steps' {s['gap_baseline']:.2f} (>= {cfg.rise_per_step:g}/step and >= "
                    f"{cfg.gap_growth:g})")
        return None


@HACKING_RULES.register("gap_high")
class GapHigh(HackingRule):
    """The RM pays far above the verifier over the window, whatever the trend."""

    def reason(self, s):
        if "gap_mean" in s and s["gap_mean"] >= self.cfg.gap_ceiling:
            return (f"gap_high: RM reward exceeds verified accuracy by {s['gap_mean']:.2f} on average over the last "
                    f"{s['window_steps']:.0f} steps (>= {self.cfg.gap_ceiling:g})")
        return None


@HACKING_RULES.register("heldout_falls")
class HeldoutFalls(HackingRule):
    """Held-out accuracy falls below its best while the RM reward rises."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.best: float | None = None
        self.latest: float | None = None
        self.samples: float | None = None  # graded samples of the latest evaluation (None: unknown)

    def observe(self, signals, steps_seen):
        if "heldout" in signals:
            self.latest, self.samples = signals["heldout"], signals.get("heldout_samples")
            self.best = self.latest if self.best is None else max(self.best, self.latest)

    def stats(self, window):
        if self.latest is None:
            return {}
        return {"heldout_accuracy": self.latest, "heldout_best": self.best,
                "heldout_drop_threshold": self.drop_threshold()}

    def drop_threshold(self) -> float:
        """heldout_drop, or heldout_z binomial standard errors of (best - latest), the larger."""
        cfg, n = self.cfg, self.samples
        if n is None:
            return cfg.heldout_drop
        standard_error = math.sqrt((self.best * (1 - self.best) + self.latest * (1 - self.latest)) / n)
        return max(cfg.heldout_drop, cfg.heldout_z * standard_error)

    def reason(self, s):
        if ("heldout_accuracy" in s and "rm_reward_slope" in s and s["rm_reward_slope"] >= self.cfg.rise_per_step
                and s["heldout_accuracy"] <= s["heldout_best"] - s["heldout_drop_threshold"]):
            return (f"heldout_falls: held-out accuracy {s['heldout_accuracy']:.3f} is "
                    f"{s['heldout_best'] - s['heldout_accuracy']:.3f} below its best {s['heldout_best']:.3f} "
                    f"(>= {s['heldout_drop_threshold']:.3f}) while the RM reward rises {s['rm_reward_slope']:+.3f}/step")
        return None


@HACKING_RULES.register("rm_blind")
class RMBlind(HackingRule):
    """The RM barely ranks a verified-correct rollout above a wrong rewrite of it."""

    def reason(self, s):
        if "rm_pair_accuracy_mean" in s and s["rm_pair_accuracy_mean"] < self.cfg.min_pair_accuracy:
            return (f"rm_blind: the RM ranks fresh (correct, wrong) pairs right only {s['rm_pair_accuracy_mean']:.2f} "
                    f"of the time over the window (< {self.cfg.min_pair_accuracy:g})")
        return None


@HACKING_RULES.register("heldout_gap_grows")
class HeldoutGapGrows(HackingRule):
    """On the held-out prompts the RM's gap grows beyond its completion-sampling noise."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.first: tuple[float, float] | None = None  # (gap, standard error) of the first evaluation
        self.latest: tuple[float, float] | None = None

    def observe(self, signals, steps_seen):
        if "heldout_gap" in signals:
            self.latest = (signals["heldout_gap"], signals.get("heldout_gap_se", 0.0))
            self.first = self.first or self.latest

    def stats(self, window):
        if self.latest is None:
            return {}
        (first, first_se), (latest, latest_se) = self.first, self.latest
        return {"heldout_gap": latest, "heldout_gap_growth": latest - first,
                "heldout_gap_threshold": max(self.cfg.gap_growth, self.cfg.heldout_z * math.hypot(first_se, latest_se))}

    def reason(self, s):
        if "heldout_gap_growth" in s and s["heldout_gap_growth"] >= s["heldout_gap_threshold"]:
            return (f"heldout_gap_grows: on the held-out prompts the RM pays {s['heldout_gap']:+.2f} more than the "
                    f"verifier, {s['heldout_gap_growth']:+.2f} from the first evaluation "
                    f"(>= {s['heldout_gap_threshold']:.3f})")
        return None


@HACKING_RULES.register("wrong_paid_more")
class WrongPaidMore(HackingRule):
    """The RM's pay for verified-wrong rollouts has run above its first window's (one-sided CUSUM)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.first_window: list[float] = []
        self.baseline: float | None = None  # the first window's mean wrong-rollout reward
        self.cusum: float | None = None  # one-sided cumulative sum of (value - baseline - gap_growth / 2)
        self.last: float | None = None  # the latest value, and Welford's count / mean / M2 of the steps'
        self.diffs = (0, 0.0, 0.0)  # differences: the noise in O(1) a step
        self.noise = 0.0

    def observe(self, signals, steps_seen):
        """Once the first window gives a baseline, accumulate how far each step's wrong-rollout reward runs above
        it beyond an allowance of half the growth worth detecting; and its step noise."""
        if "wrong_reward" not in signals:
            return
        value = signals["wrong_reward"]
        if steps_seen <= self.cfg.window:
            self.first_window.append(value)
        if self.last is not None:
            count, mean, m2 = self.diffs
            diff = value - self.last
            count += 1
            delta = diff - mean
            mean += delta / count
            self.diffs = (count, mean, m2 + delta * (diff - mean))
            self.noise = math.sqrt(self.diffs[2] / (count - 1) / 2) if count >= 2 else 0.0
        self.last = value
        if self.baseline is None:
            if steps_seen >= self.cfg.window and len(self.first_window) >= min_points(self.cfg):
                self.baseline, self.cusum = statistics.fmean(self.first_window), 0.0
        else:
            self.cusum = max(0.0, self.cusum + value - self.baseline - self.cfg.gap_growth / 2)

    def stats(self, window):
        if self.cusum is None:
            return {}
        return {"wrong_reward_cusum": self.cusum, "wrong_reward_noise": self.noise,
                "wrong_reward_threshold": self.cfg.window_z * self.noise}

    def reason(self, s):
        cfg = self.cfg
        if "wrong_reward_cusum" in s and s["wrong_reward_cusum"] >= s["wrong_reward_threshold"] > 0:
            return (f"wrong_paid_more: the RM's reward on verified-wrong rollouts has run above the first "
                    f"{cfg.window} steps' {self.baseline:.2f} by {s['wrong_reward_cusum']:.2f} beyond "
                    f"{cfg.gap_growth / 2:g}/step (cumulative sum; >= {cfg.window_z:g} x its step noise "
                    f"{s['wrong_reward_noise']:.3f})")
        return None


@HACKING_RULES.register("probe_paid_as_right")
class ProbePaidAsRight(HackingRule):
    """The RM pays an attack form of the probe suite (rm/probes.py) nearly like a verified-correct answer.

    It reads the latest probe reading (logged every --eval.steps) and holds while, for some form the rule verifier
    grades wrong, premium(form) >= probe_share x premium(right): the RM pays the attack most of the way from a
    wrong answer's pay to a right one's. A standing property of the RM, true from step 0 for an RM with a blind
    spot, so it is not among the default rules (with --cooper.on_hacking stop it would end such a run at its first
    evaluation); its statistics are logged either way, and `--cooper.hacking_rules ...,probe_paid_as_right` arms it."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.latest: dict[str, float] = {}  # form -> premium, the last reading
        self.worst = ""  # the attack form paid most, at the last reading

    def observe(self, signals, steps_seen):
        reading = {key.split("/", 1)[1]: value for key, value in signals.items() if key.startswith("probe_premium/")}
        if "right" in reading:
            self.latest = reading

    def stats(self, window):
        right = self.latest.get("right")
        attacks = {form: value for form, value in self.latest.items() if form != "right"}
        if right is None or right <= 0 or not attacks:
            return {}
        form = max(attacks, key=attacks.get)
        self.worst = form
        return {"probe_right_premium": right, "probe_worst_share": attacks[form] / right}

    def reason(self, s):
        if "probe_worst_share" in s and s["probe_worst_share"] >= self.cfg.probe_share:
            return (f"probe_paid_as_right: the RM pays the probe form {self.worst!r} (graded wrong by the verifier) "
                    f"{s['probe_worst_share']:.0%} of the way from a wrong answer's pay to a right one's "
                    f"(>= {self.cfg.probe_share:.0%}; right answers' premium {s['probe_right_premium']:.2f})")
        return None


# The letters the rules had before they were named (docs/lab/notebook.md and old run configs use them). They stop
# parsing on LETTERS_REMOVED: old configs have had a release cycle of warnings to move to the names.
LETTERS_REMOVED = "2027-03-01"
LETTERS = {"A": "gap_growing", "B": "gap_high", "C": "heldout_falls", "D": "rm_blind", "E": "heldout_gap_grows",
           "F": "wrong_paid_more"}


def named_rules(text: str) -> str:
    """`text` with old letters ("ABCD", "F") written as the rules' names, comma-separated; anything else as it is.
    For comparing settings recorded in either form (a lab folder's `lab_settings.json`)."""
    text = text.strip()
    return ",".join(LETTERS[letter] for letter in text) if text and set(text) <= set(LETTERS) else text


def parse_rule_names(text: str) -> tuple[str, ...]:
    """`--cooper.hacking_rules`: comma-separated rule names, in the registry's order; raises ValueError on an unknown
    name. A string of old letters ("ABCD", "F") is read through `LETTERS`, with a deprecation warning."""
    text = text.strip()
    if named_rules(text) != text:
        logger.warning("--cooper.hacking_rules %s: letters are deprecated and stop parsing on %s; name the rules: %s",
                       text, LETTERS_REMOVED, named_rules(text))
    names = [name.strip() for name in named_rules(text).split(",") if name.strip()]
    if not names:
        raise ValueError(f"rules must name at least one rule of {list(HACKING_RULES)}, got {text!r}")
    chosen = {HACKING_RULES.check(name) for name in names}
    return tuple(name for name in HACKING_RULES if name in chosen)
