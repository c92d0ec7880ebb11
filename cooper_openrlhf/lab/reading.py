"""What a lab's runs show, in sentences a newcomer can read (the lab's last lines), and the committed result.

The paper (arXiv 2508.05613, Qwen2.5-1.5B-Instruct): a static RM is hacked (training reward -> ~1.0 while
accuracy collapses: 38.91 against the base's 54.93), and Cooper ends level with the rule reward (58.02 against
57.48). Its mechanism is the RM's: a frozen RM keeps paying what the policy learns to write, a co-trained one is
corrected. So each RM arm is judged by what its RM paid the policy's own training rollouts, the verified-right and
the verified-wrong ones, means of the first and last VERIFIED_WINDOW steps, with the AUC of right against wrong
(`pay_verdict`): exploited when wrong answers come to be paid more or the AUC falls, by more than MOVE; degenerate
when right and wrong end paid alike. A lab's tiny policy barely answers held-out problems it never saw (a 2-layer
model mostly memorises its sums: its held-out accuracy can start near 0, where no fall can show), so held-out
accuracy is described, never the judge; the rule-verified accuracy of the training rollouts is read beside it.
Nothing is called the paper's finding: with fewer than RELIABLE_SEEDS seeds per arm the lines say so, and the last
lines are always the committed results (`committed_results`: the pre-registered batches' tests, docs/results.md),
which a few seeds on a laptop neither confirm nor overturn. They are read from the committed verdict files the
index docs/results/verdicts.json lists, never written here, in the checkout the caller names (`checkout`: the lab's
command passes lab/batch.py `package_checkout()`; an installed package has none, and the lines say so).
"""

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cooper_openrlhf.report.registered_measures import (EXPLOIT_RATE, FINAL_PROBE_PREMIUM, HELDOUT_FINAL,
                                                        LOWER_IS_BETTER, STATES_REFERENCE_RATE, TRAINING_VERIFIED)

logger = logging.getLogger(__name__)

MOVE = 0.05  # a change worth naming: above one evaluation's noise at the lab's 128 graded samples
RELIABLE_SEEDS = 3
# The committed verdicts' index in a checkout: the batches, their verdict files and the full lab's figure (the
# package ships no docs/).
VERDICT_INDEX = Path("docs") / "results" / "verdicts.json"
# Where the committed results are described, in words, when no index can be read.
RESULTS_PAGE = "docs/results.md"
# A verdict's measure in words, and what "static - rule" above and below 0 mean in it.
MEASURE_WORDS = {
    HELDOUT_FINAL: ("held-out accuracy (the mean of the last 3 evaluations)", "ended above", "ended below"),
    TRAINING_VERIFIED: ("the rule-verified accuracy of the training rollouts (the last 20 steps)", "ended above",
                        "ended below"),
    EXPLOIT_RATE: ("the exploit rate (the share of the last 20 steps' training rollouts written in the lab's style "
                   "and verified wrong; less is better)", "wrote more wrong answers in the style than",
                   "wrote fewer wrong answers in the style than"),
    FINAL_PROBE_PREMIUM: ("the final RM's exploit premium on the probe suite (what it pays the exploit's forms above "
                          "canonical wrong answers at the last evaluation; less is better)",
                          "paid the exploit more than", "paid the exploit less than"),
    STATES_REFERENCE_RATE: ("the share of the last 20 steps' training rollouts verified wrong that state the reference "
                            "(less is better)", "wrote more of them than", "wrote fewer of them than"),
}
# The Cooper arms of a plan with several (the probe lab's), as a sentence names them.
ARM_WORDS = {"cooper": "Cooper (the policy as its own assistant)",
             "cooper_frozen_assistant": "Cooper with the frozen warm start as assistant",
             "cooper_rollout": "Cooper on the policy's own wrong rollouts"}
CONTROL = "the control, an RM updated as Cooper's on fresh offline pairs that never saw the policy"
LOW_START = 0.10  # held-out accuracy below this at the first evaluation leaves a fall almost no room to show
VERIFIED_WINDOW = 10  # steps averaged at each end of a training-rollout curve (a step grades a few dozen rollouts)

Curve = Sequence[tuple[int, float]]


def _ends(curve: Curve) -> tuple[float, float] | None:
    return (curve[0][1], curve[-1][1]) if len(curve) >= 2 else None


def _window_ends(curve: Curve) -> tuple[float, float] | None:
    """Means of the first and the last VERIFIED_WINDOW points (of half the curve each when it is shorter)."""
    width = min(VERIFIED_WINDOW, len(curve) // 2)
    if width == 0:
        return None
    values = [value for _, value in curve]
    return sum(values[:width]) / width, sum(values[-width:]) / width


def verified_reading(verified: Mapping[str, Curve]) -> list[str]:
    """A sentence on the arms' training rollouts: what the rule verifier grades of what each policy writes."""
    ends = {arm: _window_ends(verified.get(arm, [])) for arm in ("rule", "static", "cooper")}
    ends = {arm: pair for arm, pair in ends.items() if pair}
    if "static" not in ends or "rule" not in ends:
        return []
    names = {"rule": "rule", "static": "static", "cooper": "Cooper"}
    trend = ", ".join(f"{names[arm]} {first:.2f} -> {last:.2f}" for arm, (first, last) in ends.items())
    static_first, static_last = ends["static"]
    verdict = ("the static RM's policy writes fewer verified answers" if static_first - static_last > MOVE else
               "the static RM's policy ends below the rule arm's" if ends["rule"][1] - static_last > MOVE else
               "the static RM's policy keeps its verified accuracy")
    if "cooper" in ends:
        cooper_first, cooper_last = ends["cooper"]
        verdict += ("; Cooper's ends level with the rule arm's" if abs(cooper_last - ends["rule"][1]) <= MOVE else
                    "; Cooper's ends " + ("above" if cooper_last > ends["rule"][1] else "below") + " the rule arm's")
        if cooper_first - cooper_last > MOVE:
            verdict += f", though it fell by {cooper_first - cooper_last:.2f}"
    return [f"The policies, on the training prompts (the rule-verified accuracy of each arm's rollouts, means of the "
            f"first and last {VERIFIED_WINDOW} steps): {trend}: {verdict}."]


@dataclass(frozen=True)
class PayEnds:
    """What an arm's RM paid its policy's training rollouts, means over its seeds of the first and the last
    VERIFIED_WINDOW steps: verified-right, verified-wrong, and the AUC of right against wrong."""

    right: tuple[float, float]
    wrong: tuple[float, float]
    auc: tuple[float, float]
    seeds: int


def _seed_windows(rows: Sequence[Mapping]) -> tuple[tuple[float, float, float], tuple[float, float, float]] | None:
    """(right pay, wrong pay, AUC) of one run's first and last VERIFIED_WINDOW steps; None when a window lacks a
    right or a wrong rollout with a reward."""
    from cooper_openrlhf.report.rm_measures import auc

    paid = [r for r in rows if r.get("reward") is not None]
    if not paid:
        return None
    steps = sorted({int(r["step"]) for r in paid})
    width = min(VERIFIED_WINDOW, len(steps) // 2)
    ends = []
    for chosen in (set(steps[:width]), set(steps[-width:])) if width else ():
        right = [float(r["reward"]) for r in paid if int(r["step"]) in chosen and r["verified"]]
        wrong = [float(r["reward"]) for r in paid if int(r["step"]) in chosen and not r["verified"]]
        if not right or not wrong:
            return None
        ends.append((sum(right) / len(right), sum(wrong) / len(wrong), auc(right, wrong)))
    return (ends[0], ends[1]) if len(ends) == 2 else None


def pay_ends(rows_by_seed: Sequence[Sequence[Mapping]]) -> PayEnds | None:
    """Pure: each seed's rollout rows (step, verified, reward) -> the arm's PayEnds, over the seeds whose windows
    hold both right and wrong rollouts; None when none does (a rule arm: no RM reward)."""
    read = [w for w in map(_seed_windows, rows_by_seed) if w is not None]
    if not read:
        return None

    def mean(end: int, field: int) -> float:
        return sum(w[end][field] for w in read) / len(read)

    return PayEnds(*[(mean(0, field), mean(1, field)) for field in range(3)], seeds=len(read))


def pay_verdict(ends: PayEnds) -> str:
    """An RM judged by what it paid its policy's right and wrong rollouts: degenerate (it stopped paying right
    answers, by more than MOVE, and ends paying them within DEGENERATE_MARGIN of wrong ones), exploited (wrong answers
    paid more, or the AUC fell, by more than MOVE: for a frozen RM, the policy finding what it overpays), corrected
    (wrong answers paid less by more than MOVE, right ones not), or unchanged."""
    from cooper_openrlhf.report.rm_measures import DEGENERATE_MARGIN

    (right0, right1), (wrong0, wrong1), (auc0, auc1) = ends.right, ends.wrong, ends.auc
    if right0 - right1 > MOVE and right1 - wrong1 < DEGENERATE_MARGIN:
        return (f"it stopped paying right answers and ends paying them within {DEGENERATE_MARGIN} of wrong ones: a "
                "degenerate RM, whatever it pays any one exploit")
    if wrong1 - wrong0 > MOVE or auc0 - auc1 > MOVE:
        return ("its policy found what it overpays: wrong answers paid more"
                + (f" and the AUC down by {auc0 - auc1:.2f}" if auc0 - auc1 > MOVE else "") + " (an exploited RM)")
    if wrong0 - wrong1 > MOVE and right0 - right1 <= MOVE:
        return "it came to pay wrong answers less and kept paying right ones: it still tells them apart"
    return "it kept telling right from wrong as it started"


def pay_reading(ends_by_arm: Mapping[str, PayEnds]) -> list[str]:
    """One line per RM arm: what its RM paid the policy's verified-right and verified-wrong training rollouts,
    first -> last, the AUC of right against wrong, and `pay_verdict`."""
    names = {"static": "Static RM", "cooper": "Cooper's RM"}
    return [f"{names.get(arm, f'{arm} RM')}: paid the policy's verified-right training rollouts {e.right[0]:.2f} -> "
            f"{e.right[1]:.2f}, verified-wrong ones {e.wrong[0]:.2f} -> {e.wrong[1]:.2f}, AUC right vs wrong "
            f"{e.auc[0]:.2f} -> {e.auc[1]:.2f} (first and last {VERIFIED_WINDOW} steps): {pay_verdict(e)}."
            for arm, e in ends_by_arm.items()]


def reading(pays: Mapping[str, PayEnds], heldout: Mapping[str, Curve], seeds: Mapping[str, int],
            verified: Mapping[str, Curve] | None = None, checkout: Path | None = None) -> list[str]:
    """Sentences on a lab's arms: each RM arm judged by what its RM paid the policy's verified-right and
    verified-wrong training rollouts (`pays`: arm -> PayEnds), the policies' rule-verified training accuracy
    (`verified`: arm -> seed-mean curve), held-out accuracy as a description only (it often starts too low to fall),
    and a caveat when few seeds ran, naming the full lab's figure in `checkout` (`full_lab_figure`)."""
    lines = pay_reading(pays) + verified_reading(verified or {})
    ends = {arm: _ends(heldout.get(arm, [])) for arm in ("static", "cooper", "rule")}
    ends = {arm: pair for arm, pair in ends.items() if pair}
    if ends and (lines or len(ends) >= 2):
        trend = ", ".join(f"{arm} {first:.2f} -> {last:.2f}" for arm, (first, last) in ends.items())
        room = (f"; it started at {max(first for first, _ in ends.values()):.2f} at most: the warm-started policy "
                "barely answers problems it never saw, so a fall has almost no room to show, and the RM lines above "
                "are the judge" if max(first for first, _ in ends.values()) < LOW_START else "")
        lines.append(f"Held-out accuracy (first -> last evaluation): {trend}{room}.")
    fewest = min((seeds[arm] for arm in ("static", "cooper", "rule") if arm in seeds), default=0)
    if lines and fewest < RELIABLE_SEEDS:
        figure = full_lab_figure(checkout)
        lines.append(f"{'One seed' if fewest == 1 else f'{fewest} seeds'} per arm cannot show this reliably (one seed "
                     f"is one draw): none of the above is the paper's finding or the lab's; the pre-registered "
                     f"batches over 12 seeds per arm, with controls: "
                     f"{figure if figure == RESULTS_PAGE else f'{figure} ({RESULTS_PAGE})'}.")
    return lines


def _numbers(result: dict, *keys: str) -> dict:
    """A comparison's difference, mean, CI and p rounded as printed, with `keys` of it besides."""
    rounded = {"difference": result["difference"], "mean": round(result["mean"], 3),
               "ci": tuple(round(c, 3) for c in result["ci"]), "p": round(result["p"], 3)}
    return {**rounded, **{k: round(result[k], 3) if isinstance(result[k], float) else result[k]
                          for k in keys if k in result}}


def _outcome(verdict: str, measure: str) -> str:
    """"beats", "worse", "within noise" or "uninformative": a comparison's verdict seen from the arm tested."""
    better = "below" if measure in LOWER_IS_BETTER else "above"
    return verdict if verdict in ("uninformative", "within noise") else "beats" if verdict == better else "worse"


def verdict_summary(verdict: dict) -> dict:
    """The numbers of a verdict that the lab's last line states, rounded as printed. For a plan with one primary
    (`report.plan_verdict.plan_verdict`'s output): the primary and its outcome for Cooper ("beats", "worse", "within
    noise" or "uninformative"), the validity gate, the equivalence tests and the static - rule secondary on the
    plan's measure. For a plan whose primaries form a sequence: `sequence_summary`."""
    if "sequence" in verdict:
        return sequence_summary(verdict)
    primary = verdict["primary"]
    outcome = _outcome(primary["verdict"], verdict["measure"])
    gate = primary.get("validity_gate")
    static_rule = next((r for r in verdict["secondary"] if r.get("difference") == "static - rule"), None)
    return {"seeds": primary["seeds"], "measure": verdict["measure"], "outcome": outcome,
            "primary": _numbers(primary), "validity_gate": _numbers(gate, "passed") if gate else None,
            "equivalence": tuple(_numbers(r, "margin", "verdict") for r in verdict.get("equivalence", [])),
            "static_rule": _numbers(static_rule, "p_holm", "verdict") if static_rule else None}


def sequence_summary(verdict: dict) -> dict:
    """`verdict_summary` of a plan whose primaries form a fixed sequence (`report.sequence_verdict.sequence_verdict`'s
    output): per entry, its measure, whether it was tested, its validity gates, and each Cooper arm's difference from
    the control with its outcome."""
    entries = []
    for record in verdict["sequence"]:
        entries.append({"measure": record["measure"], "tested": record["tested"],
                        "gates": tuple(_numbers(g, "must_be", "passed") for g in record["validity_gates"]),
                        "results": tuple({**_numbers(r, "p_holm"), "outcome": _outcome(r["verdict"], record["measure"])}
                                         for r in record["results"])})
    seeds = max((r["seeds"] for record in verdict["sequence"] for r in record["results"]), default=0)
    return {"kind": "sequence", "seeds": seeds, "entries": tuple(entries)}


@cache
def committed_results(checkout: Path | None) -> tuple[dict, ...]:
    """The committed verdicts the index of `checkout` (VERDICT_INDEX) lists, oldest first: each batch's name and lab
    with `verdict_summary` of its verdict file (what `cli.batch PLAN --verdict` wrote). Empty, with a warning naming
    what is missing, without a checkout or without its index."""
    if checkout is None:
        logger.warning("the package runs from no repository checkout: the lab's committed results (%s in a clone) are "
                       "not stated", VERDICT_INDEX)
        return ()
    index = checkout / VERDICT_INDEX
    if not index.is_file():
        logger.warning("no %s: the lab's committed results are not stated", index)
        return ()
    batches = json.loads(index.read_text())["batches"]
    return tuple({"batch": entry["batch"], "lab": entry["lab"],
                  **verdict_summary(json.loads((index.parent / entry["verdict"]).read_text()))} for entry in batches)


def full_lab_figure(checkout: Path | None) -> str:
    """The newest batch's figure, as a path from the checkout's root (the last index entry that names one);
    RESULTS_PAGE without a checkout or its index."""
    index = checkout / VERDICT_INDEX if checkout else None
    if index is None or not index.is_file():
        return RESULTS_PAGE
    figure = [entry["figure"] for entry in json.loads(index.read_text())["batches"] if "figure" in entry][-1]
    return str((index.parent / figure).resolve().relative_to(checkout.resolve()))


def committed_sentence(result: Mapping) -> str:
    """One committed verdict (a `committed_results` entry) in words: Cooper against the control by the plan's rule,
    then the registered equivalence with the rule arm and where the frozen RM's policy ended against the rule arm's
    (a plan with a sequence of primaries: `sequence_sentence`)."""
    if result.get("kind") == "sequence":
        return sequence_sentence(result)
    measure, more, less = MEASURE_WORDS[result["measure"]]
    primary = result["primary"]
    numbers = (f"Cooper - control {primary['mean']:+.3f}, 95% CI [{primary['ci'][0]:+.3f}, {primary['ci'][1]:+.3f}], "
               f"p {primary['p']:.3f}")
    gate = result["validity_gate"]
    words = {"beats": f"Cooper beat {CONTROL} ({numbers})",
             "worse": f"Cooper did worse than {CONTROL} ({numbers})",
             "within noise": f"Cooper did not beat {CONTROL} ({numbers}: within noise)",
             "uninformative": f"the test of Cooper against {CONTROL} is uninformative ({numbers}): the control's policy "
                              f"was not shown hurt, as the plan required"
                              + (f" ({gate['difference']} {gate['mean']:+.3f}, p {gate['p']:.3f})" if gate else "")}
    sentence = (f"The committed result of {result['lab']} (batch {result['batch']}, {result['seeds']} seeds per arm, "
                f"pre-registered; docs/results.md), on {measure}: {words[result['outcome']]}")
    if gate and gate["passed"]:
        sentence += (f"; the control's policy was hurt, as the plan required ({gate['difference']} "
                     f"{gate['mean']:+.3f}, p {gate['p']:.3f})")
    for test in result["equivalence"]:
        shown = "are equivalent" if test["verdict"] == "equivalent" else "were not shown equivalent"
        sentence += (f"; Cooper and the rule arm {shown} within ±{test['margin']:.2f} ({test['difference']} "
                     f"{test['mean']:+.3f}, two one-sided tests p {test['p']:.3f})")
    static_rule = result["static_rule"]
    if static_rule:
        side = more if static_rule["mean"] > 0 else less
        said = (f"{side} the rule arm's by less than the plan's test can tell from noise"
                if static_rule["verdict"] == "within noise" else f"{side} the rule arm's")
        holm = f", Holm-adjusted {static_rule['p_holm']:.3f}" if "p_holm" in static_rule else ""
        sentence += (f", and the frozen RM's policy {said} ({static_rule['difference']} {static_rule['mean']:+.3f} "
                     f"[{static_rule['ci'][0]:+.3f}, {static_rule['ci'][1]:+.3f}], p {static_rule['p']:.3f}{holm})")
    return sentence + "."


def sequence_sentence(result: Mapping) -> str:
    """A sequence verdict in words, entry by entry in the registered order: each Cooper arm against the control by
    the plan's rule (Holm within the entry), an entry whose validity gate failed as uninformative, and an entry not
    tested as such, with the reason."""
    words = {"beats": "beat {control}", "worse": "did worse than {control}", "within noise": "did not beat {control}",
             "uninformative": "was not tested informatively against {control}"}
    parts, control = [], CONTROL  # the control in full where it is first named, then in short
    for entry in result["entries"]:
        lead = "on " + MEASURE_WORDS[entry["measure"]][0]
        if not entry["tested"]:
            parts.append(f"{lead}: not tested, as registered, since no Cooper arm beat {control} before it")
            control = "the control"
            continue
        failed = [g for g in entry["gates"] if not g["passed"]]
        if failed:
            gate = failed[0]
            parts.append(f"{lead}: uninformative, since the plan's validity gate failed ({gate['difference']} was to "
                         f"be {gate['must_be']}: {gate['mean']:+.3f} [{gate['ci'][0]:+.3f}, {gate['ci'][1]:+.3f}], "
                         f"p {gate['p']:.3f})")
            continue
        arms = []
        for tested in entry["results"]:
            arm = tested["difference"].split(" - ")[0]
            said = words[tested["outcome"]].format(control=control)
            control = "the control"
            arms.append(f"{ARM_WORDS.get(arm, arm)} {said} ({tested['difference']} {tested['mean']:+.3f}, 95% CI "
                        f"[{tested['ci'][0]:+.3f}, {tested['ci'][1]:+.3f}], p {tested['p']:.3f}, Holm-adjusted "
                        f"{tested['p_holm']:.3f})")
        parts.append(f"{lead}: " + "; ".join(arms))
    return (f"The committed result of {result['lab']} (batch {result['batch']}, {result['seeds']} seeds per arm, "
            f"pre-registered; docs/results.md): " + ". Then, ".join(parts) + ".")


def committed_result(checkout: Path | None) -> list[str]:
    """The lab's committed results in words (`committed_results`, the newest last): the lab's last lines, after any
    run's reading."""
    return [committed_sentence(result) for result in committed_results(checkout)]


def read_runs(runs, checkout: Path | None) -> list[str]:
    """`reading` of finished runs (report.runs.RunData): each RM arm's pay of its policy's training rollouts (from
    their rollout logs), the seed-mean curves, failed runs left out; then the committed results of `checkout`."""
    from cooper_openrlhf.algo.metric_keys import ACCURACY
    from cooper_openrlhf.report.aggregate import band, heldout_series
    from cooper_openrlhf.ray.run_logs import iter_rollouts

    by_arm: dict[str, list] = {}
    for run in runs:
        if not run.failed:
            by_arm.setdefault(run.arm, []).append(run)

    def curves(series_of) -> dict[str, list[tuple[int, float]]]:
        means = {arm: band([c for c in (series_of(r.scalars) for r in members) if c]) for arm, members in by_arm.items()}
        return {arm: list(zip(mean.steps, mean.mean)) for arm, mean in means.items()}

    from cooper_openrlhf.lab.arms import ARMS

    paid_by_rm = [arm for arm in by_arm if arm not in ARMS or ARMS[arm].reward == "rm"]  # the rule arm logs 0/1
    pays = {arm: pay_ends([list(iter_rollouts(Path(r.rollouts.path))) for r in by_arm[arm] if r.rollouts])
            for arm in paid_by_rm}
    return reading({arm: ends for arm, ends in pays.items() if ends}, curves(heldout_series),
                   {arm: len(members) for arm, members in by_arm.items()},
                   verified=curves(lambda s: s.get(ACCURACY, [])), checkout=checkout) + committed_result(checkout)
