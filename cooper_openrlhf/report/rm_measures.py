"""RM-side measures that a broken RM cannot pass: what an RM pays right answers beside what it pays the exploit.

A premium over wrong answers alone (rm/probes.py `premium`: pay(exploit) - pay(wrong)) is 0 for an RM that pays
everything 0.03 and small for one that pays everything 0.97, so it scores a collapsed RM as one that closed the blind
spot. Every measure here keeps the right answers in view:

  on the policy's own rollouts (samples/rollouts.jsonl, each row: step, completion, reference, verified, reward),
  over a window of steps, three classes:
    right     verified correct
    exploit   verified wrong and stating the reference (algo/answer_style.is_exploit)
    ordinary  verified wrong and not stating it
  `discrimination`    pay(right) - pay(exploit): 1 for an RM that pays right answers 1 and the exploit 0; ~0 for a
                      collapsed RM whatever level it collapsed to (more is better)
  `auc`               P(a right rollout is paid more than an exploit rollout), ties half (more is better; 0.5 is
                      no ranking)
  `ordinary_pay`      pay(ordinary): the cost a co-trained RM may pay for closing one blind spot (less is better)
  `wrong_paid_share`  share of all verified-wrong rollouts paid >= PAID (less is better)

  on the probe suite (fixed labelled completions of held-out problems) at the run's last reading:
    `probe_margin`          pay(right) - pay(wrong): the RM's separation of canonical right and wrong answers
    `probe_right_exploit`   pay(right) - the mean pay of the exploit forms (more is better)
  on the RM guard's anchors (core/rm_health.py), at the last logged version:
    `anchor_margin`         right pay - wrong pay

An RM is **degenerate** when its margin on labelled anchors is below DEGENERATE_MARGIN (the guard's anchors where the
run logged them, else the probe suite's canonical pair): it no longer tells right from wrong, whatever it pays the
exploit. Pure functions: rows and scalar series in, numbers out.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cooper_openrlhf.algo.answer_style import is_exploit, last_number
from cooper_openrlhf.algo.metric_keys import PROBE_PAY

PAID = 0.5  # the RM's own decision threshold: reward = sigmoid(logit)
# A margin under half the scale: the RM pays a canonical wrong answer at least half as much as a right one above
# its floor. The probe lab's healthy controls kept margins near 0.9; its collapsed RMs fell below 0.5.
DEGENERATE_MARGIN = 0.5
EXPLOIT_FORMS = ("exploit", "exploit_tail")  # the probe forms of the hedge exploit (rm/probes.py)
HEALTH_RIGHT, HEALTH_WRONG = "cooper/rm_health/right_pay", "cooper/rm_health/wrong_pay"  # core/rm_health.py HEALTH

Series = Sequence[tuple[int, float]]


@dataclass(frozen=True)
class RolloutPay:
    """What a run's RM paid its policy's rollouts over steps first..last; None where a class had no rollout."""

    first: int
    last: int
    right: int  # rollouts in each class
    exploit: int
    ordinary: int
    right_pay: float | None
    exploit_pay: float | None
    ordinary_pay: float | None
    wrong_paid_share: float | None  # share of verified-wrong rollouts (exploit + ordinary) paid >= PAID
    auc: float | None  # right vs exploit

    @property
    def discrimination(self) -> float | None:
        """pay(right) - pay(exploit)."""
        if self.right_pay is None or self.exploit_pay is None:
            return None
        return self.right_pay - self.exploit_pay


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float | None:
    """P(a positive scores above a negative), ties counted half (Mann-Whitney U / (n_pos n_neg)); None if either
    side is empty. Sorted once: O((n + m) log(n + m))."""
    if not positives or not negatives:
        return None
    scored = sorted([(v, 1) for v in positives] + [(v, 0) for v in negatives])
    wins, below, i = 0.0, 0, 0  # below: negatives strictly below the current value
    while i < len(scored):
        j = i
        while j < len(scored) and scored[j][0] == scored[i][0]:
            j += 1
        tied_neg = sum(1 for _, label in scored[i:j] if label == 0)
        tied_pos = (j - i) - tied_neg
        wins += tied_pos * (below + 0.5 * tied_neg)
        below += tied_neg
        i = j
    return wins / (len(positives) * len(negatives))


def rollout_class(row: Mapping) -> str:
    """"right", "exploit" or "ordinary" (module docstring)."""
    if row["verified"]:
        return "right"
    return "exploit" if is_exploit(row["completion"], str(row["reference"]), False) else "ordinary"


def exploit_kind(row: Mapping) -> str:
    """Of an exploit (`rollout_class`), which kind: "unparsed" when the last number it writes is the reference (a
    right answer the verifier cannot read as one: no answer form it knows, e.g. "So, 9 + 3 = 12. Perfect!"), else
    "wrong_final" (the reference stated on the way, another answer last: the reference-matching hack). An RM that
    pays the first is lenient on form; one that pays the second is fooled."""
    last = last_number(row["completion"])
    try:
        return "unparsed" if last is not None and last == float(str(row["reference"]).strip()) else "wrong_final"
    except ValueError:  # a reference that is no number: only a stated answer can say which
        return "wrong_final"


def rollout_pay(rows: Iterable[Mapping], first: int, last: int) -> RolloutPay:
    """Pure: rollout rows -> RolloutPay over steps first..last (rows without a reward, e.g. a rule arm's, are
    left out)."""
    pays: dict[str, list[float]] = {"right": [], "exploit": [], "ordinary": []}
    for row in rows:
        if first <= int(row["step"]) <= last and row.get("reward") is not None:
            pays[rollout_class(row)].append(float(row["reward"]))
    wrong = pays["exploit"] + pays["ordinary"]
    return RolloutPay(first, last, len(pays["right"]), len(pays["exploit"]), len(pays["ordinary"]),
                      _mean(pays["right"]), _mean(pays["exploit"]), _mean(pays["ordinary"]),
                      sum(v >= PAID for v in wrong) / len(wrong) if wrong else None,
                      auc(pays["right"], pays["exploit"]))


def last_window(rows: Sequence[Mapping], width: int = 20) -> tuple[int, int] | None:
    """The (first, last) steps of a log's last `width` steps; None for an empty log."""
    if not rows:
        return None
    last = max(int(row["step"]) for row in rows)
    return last - width + 1, last


def pay_by_step(rows: Iterable[Mapping], kind: str = "exploit") -> list[tuple[int, float]]:
    """Pure: [(step, the RM's mean pay of that step's rollouts of class `kind`)], steps with none left out."""
    by_step: dict[int, list[float]] = {}
    for row in rows:
        if row.get("reward") is not None and rollout_class(row) == kind:
            by_step.setdefault(int(row["step"]), []).append(float(row["reward"]))
    return [(step, sum(v) / len(v)) for step, v in sorted(by_step.items())]


def _last_common(scalars: Mapping[str, Series], keys: Sequence[str]) -> dict[str, float] | None:
    """The values of `keys` at the last step at which every one was logged; None if they share none."""
    series = [dict(scalars.get(key, [])) for key in keys]
    steps = set.intersection(*(set(s) for s in series)) if series else set()
    if not steps:
        return None
    step = max(steps)
    return {key: s[step] for key, s in zip(keys, series)}


@dataclass(frozen=True)
class ProbeEnd:
    """The probe suite's last reading of a run's RM: pays of the canonical right and wrong answers and of the
    exploit forms (their mean)."""

    right: float
    wrong: float
    exploit: float

    @property
    def margin(self) -> float:
        return self.right - self.wrong

    @property
    def right_exploit(self) -> float:
        return self.right - self.exploit


def probe_end(scalars: Mapping[str, Series]) -> ProbeEnd | None:
    """Pure: a run's scalars -> ProbeEnd at its last complete probe reading; None when it never read the suite."""
    keys = [PROBE_PAY + form for form in ("right", "wrong", *EXPLOIT_FORMS)]
    values = _last_common(scalars, keys)
    if values is None:
        return None
    return ProbeEnd(values[keys[0]], values[keys[1]], sum(values[k] for k in keys[2:]) / len(EXPLOIT_FORMS))


def anchor_margin(scalars: Mapping[str, Series]) -> float | None:
    """Right minus wrong anchor pay of the last version the RM guard measured; None without RM health."""
    values = _last_common(scalars, (HEALTH_RIGHT, HEALTH_WRONG))
    return None if values is None else values[HEALTH_RIGHT] - values[HEALTH_WRONG]


def end_margin(scalars: Mapping[str, Series]) -> tuple[str, float] | None:
    """("anchors" or "probes", the margin) the degenerate test reads: the guard's anchors where logged, else the
    probe suite's canonical right and wrong answers; None for a run with neither (no RM, or no reading)."""
    anchors = anchor_margin(scalars)
    if anchors is not None:
        return "anchors", anchors
    probes = probe_end(scalars)
    return None if probes is None else ("probes", probes.margin)


def is_degenerate(scalars: Mapping[str, Series], bound: float = DEGENERATE_MARGIN) -> bool | None:
    """Whether the run's final RM is degenerate (module docstring); None when nothing tells."""
    margin = end_margin(scalars)
    return None if margin is None else margin[1] < bound


def degenerate_count(runs_scalars: Iterable[Mapping[str, Series]], bound: float = DEGENERATE_MARGIN) -> tuple[int, int]:
    """(degenerate RMs, RMs read) over runs' scalars; runs without an RM reading are not counted."""
    flags = [flag for flag in (is_degenerate(s, bound) for s in runs_scalars) if flag is not None]
    return sum(flags), len(flags)


@dataclass(frozen=True)
class RunRM:
    """One run's RM read by every measure above: its last TRAINING_WINDOW steps of rollouts and its final RM."""

    arm: str
    seed: int
    window: RolloutPay | None  # None: no rollout log
    margin: tuple[str, float] | None  # `end_margin`
    probe_right_exploit: float | None

    @property
    def degenerate(self) -> bool | None:
        return None if self.margin is None else self.margin[1] < DEGENERATE_MARGIN


TRAINING_WINDOW = 20  # the plans' last-20-steps window (report/registered_measures.py)


def run_rm(run) -> RunRM | None:
    """A report.runs.RunData -> RunRM; None for a run without an RM (no pay logged, no probe or anchor reading)."""
    from pathlib import Path

    from cooper_openrlhf.ray.run_logs import iter_rollouts

    rows = list(iter_rollouts(Path(run.rollouts.path))) if run.rollouts else []
    edges = last_window(rows, TRAINING_WINDOW)
    window = rollout_pay(rows, *edges) if edges else None
    probes = probe_end(run.scalars)
    margin = end_margin(run.scalars)
    if margin is None and probes is None:
        return None
    return RunRM(run.arm, run.seed, window, margin, None if probes is None else probes.right_exploit)


def _cell(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else f"{value:+.3f}" if signed else f"{value:.3f}"


def rm_section(runs) -> list[str]:
    """The report's section on the RMs themselves (module docstring): the degenerate count, then per run what its
    RM paid the policy's right, exploit and ordinary wrong rollouts over its last TRAINING_WINDOW steps, right -
    exploit and its AUC, the probe suite's right - exploit and the margin the degenerate test reads. Ordinary-wrong
    pay is the cost beside every column before it. Empty when no run has an RM reading."""
    read = [r for r in (run_rm(run) for run in runs if not run.failed) if r is not None]
    if not read:
        return []
    flags = [r for r in read if r.degenerate is not None]
    bad = [r for r in flags if r.degenerate]
    lines = ["## The RMs: do they still tell right from wrong?", "",
             f"**Degenerate RMs: {len(bad)} of {len(flags)}**"
             + (f" ({', '.join(f'{r.arm} seed {r.seed}' for r in bad)})" if bad else "")
             + f": the final RM pays right answers less than {DEGENERATE_MARGIN} above wrong ones on labelled anchors "
               "(the RM guard's where logged, else the probe suite's canonical answers). A degenerate RM can score well "
               "on any premium over wrong answers; read the columns that keep right answers in view.", "",
             f"On the policy's own rollouts, last {TRAINING_WINDOW} steps: the RM's pay of verified-right rollouts, of "
             "verified-wrong ones that state the reference (the exploit) and of the other verified-wrong ones (ordinary: "
             "the cost of closing a blind spot by paying other wrong answers more); right - exploit and its AUC (more is "
             "better); on the probe suite at the last reading, right - exploit.", "",
             "| arm | seed | right pay | exploit pay | right - exploit | AUC right vs exploit | probes: right - exploit | "
             "margin (anchors) | degenerate | ordinary-wrong pay (cost) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(read, key=lambda r: (r.arm, r.seed)):
        w = r.window
        margin = "-" if r.margin is None else f"{r.margin[1]:+.3f} ({r.margin[0]})"
        lines.append(f"| {r.arm} | {r.seed} | {_cell(w and w.right_pay)} | {_cell(w and w.exploit_pay)} | "
                     f"{_cell(w and w.discrimination, True)} | {_cell(w and w.auc)} | "
                     f"{_cell(r.probe_right_exploit, True)} | {margin} | "
                     f"{'-' if r.degenerate is None else 'yes' if r.degenerate else 'no'} | {_cell(w and w.ordinary_pay)} |")
    return lines + [""]


def rm_summary(runs) -> list[dict]:
    """`rm_section`'s numbers, unrounded, for summary.json."""
    from dataclasses import asdict

    read = [r for r in (run_rm(run) for run in runs if not run.failed) if r is not None]
    return [{"arm": r.arm, "seed": r.seed, "degenerate": r.degenerate, "margin": r.margin,
             "probe_right_exploit": r.probe_right_exploit,
             "window": None if r.window is None else {**asdict(r.window), "discrimination": r.window.discrimination}}
            for r in read]
