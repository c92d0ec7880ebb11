"""A pre-registered plan's test, read off its finished runs: the primary difference judged by the plan's decision
rule, the secondary differences, and how often the static arm fell (a plan's "primary" and "secondary" entries,
docs/batch33b/plan.json).

The decision rule is the one the plan states, in code (`decide`); `check_decision_rule` refuses a plan whose rule
is worded otherwise, so the verdict can never be judged by a rule other than the one written before the runs.
The statistics are the report's (`report.seed_stats`): final = mean of the last 3 held-out evaluations, a 95%
percentile bootstrap interval over seeds (10000 resamples) and the exact two-sided sign-flip p-value.
"""

import json
import re
from pathlib import Path

from cooper_openrlhf.report.seed_stats import PairedComparison, paired_comparison

ALPHA = 0.05
DECISION_RULE = ("beats the control if CI lower end > 0 and p < 0.05; worse if CI upper end < 0 and p < 0.05; "
                 "else within noise")
_DIFFERENCE = re.compile(r"^\s*([a-z_]+)\s+-\s+([a-z_]+)\b")
_STATIC_FALLS = re.compile(r"^static falls: final below its seed's rule final by more than ([0-9.]+)")


def lab_finals(lab: Path) -> dict[str, dict[int, float]]:
    """{arm: {seed: final held-out accuracy}} of a lab folder's finished runs (failed or curve-less runs left out)."""
    from cooper_openrlhf.report.aggregate import heldout_series
    from cooper_openrlhf.report.runs import load_run
    from cooper_openrlhf.report.seed_stats import final_value

    finals: dict[str, dict[int, float]] = {}
    for info in sorted((lab / "runs").glob("*/run_info.json")):
        if json.loads(info.read_text(encoding="utf-8")).get("status") != "done":  # one under way: a partial curve
            continue
        run = load_run(info.parent)
        curve = [] if run.failed else heldout_series(run.scalars)
        if curve:
            finals.setdefault(run.arm, {})[run.seed] = final_value(curve)
    return finals


def parse_difference(text: str) -> tuple[str, str]:
    """"cooper - offline_pairs, paired by seed" -> ("cooper", "offline_pairs")."""
    match = _DIFFERENCE.match(text)
    if not match:
        raise ValueError(f"not a difference of two arms ('<arm> - <arm>'): {text!r}")
    return match.group(1), match.group(2)


def check_decision_rule(plan: dict) -> None:
    stated = " ".join(plan["primary"]["decision"].split())
    if stated != DECISION_RULE:
        raise ValueError(f"the plan's decision rule is {stated!r}; this tool decides by {DECISION_RULE!r} only")


def decide(comparison: PairedComparison) -> str:
    """The plan's rule for A - B: "above" (A beats the control B), "below" (A is worse), or "within noise"."""
    low, high = comparison.interval
    if low > 0 and comparison.p_value < ALPHA:
        return "above"
    if high < 0 and comparison.p_value < ALPHA:
        return "below"
    return "within noise"


PRIMARY_WORDS = {"above": "beats the control", "below": "worse than the control", "within noise": "within noise"}


def _compare(finals: dict[str, dict[int, float]], text: str) -> dict:
    a, b = parse_difference(text)
    missing = [arm for arm in (a, b) if arm not in finals]
    if missing:
        raise ValueError(f"{text!r}: no finished run of {', '.join(missing)} (arms with runs: {', '.join(sorted(finals))})")
    compared = paired_comparison(finals[a], finals[b])
    if compared is None:
        raise ValueError(f"{text!r}: {a} and {b} share fewer than 2 seeds")
    verdict = decide(compared)
    return {"difference": f"{a} - {b}", "seeds": compared.seeds, "mean": compared.mean_difference,
            "ci": list(compared.interval), "p": compared.p_value, "verdict": verdict,
            "in_words": {"above": f"{a} above {b}", "below": f"{a} below {b}"}.get(verdict, verdict)}


def static_falls(finals: dict[str, dict[int, float]], margin: float) -> dict:
    """Seeds whose static final is below the same seed's rule final by more than `margin`."""
    seeds = sorted(set(finals.get("static", {})) & set(finals.get("rule", {})))
    fell = [s for s in seeds if finals["rule"][s] - finals["static"][s] > margin]
    return {"margin": margin, "seeds": len(seeds), "fell": fell}


def plan_verdict(plan: dict, finals: dict[str, dict[int, float]]) -> dict:
    """The plan's primary test and its secondary entries that are differences or the static-falls count; any other
    secondary entry is listed as read elsewhere (e.g. the blind-spot figure)."""
    check_decision_rule(plan)
    secondary, elsewhere = [], []
    for entry in plan.get("secondary", []):
        falls = _STATIC_FALLS.match(entry)
        if falls:
            secondary.append({"entry": entry, **static_falls(finals, float(falls.group(1)))})
        elif _DIFFERENCE.match(entry):
            secondary.append({"entry": entry, **_compare(finals, entry)})
        else:
            elsewhere.append(entry)
    primary = _compare(finals, plan["primary"]["difference"])
    primary["in_words"] = PRIMARY_WORDS[primary["verdict"]]
    return {"lab": plan["primary"]["lab"], "commit": plan.get("commit"),
            "primary": {"entry": plan["primary"]["difference"], **primary},
            "secondary": secondary, "elsewhere": elsewhere,
            "finals": {arm: {str(s): v for s, v in sorted(by_seed.items())} for arm, by_seed in finals.items()}}


def run_hours(labs: list[Path]) -> float:
    """Hours of run time over the labs' recorded runs (each run's own `seconds` in lab.json): what a batch cost, which
    no one wall time says when it was resumed across sessions."""
    seconds = 0.0
    for lab in labs:
        record = lab / "lab.json"
        if record.is_file():
            seconds += sum(r.get("seconds") or 0 for r in json.loads(record.read_text(encoding="utf-8")).get("runs", []))
    return seconds / 3600


def _row(result: dict) -> str:
    low, high = result["ci"]
    return (f"| {result['difference']} | {result['seeds']} | {result['mean']:+.3f} | [{low:+.3f}, {high:+.3f}] | "
            f"{result['p']:.3f} | {result['in_words']} |")


def render(verdict: dict, plan_path: str = "") -> str:
    primary = verdict["primary"]
    lines = [f"# The plan's test{f' ({plan_path})' if plan_path else ''}", "",
             f"Lab `{verdict['lab']}`; final = mean of the last 3 held-out evaluations; differences paired by seed, "
             "95% percentile bootstrap CI over seeds (10000 resamples), exact two-sided sign-flip p. Decision rule "
             f"(the plan's): {DECISION_RULE}." + (f" Configuration frozen at commit `{verdict['commit']}`."
                                                     if verdict.get("commit") else "")
             + (f" The plan's labs' runs took {verdict['run_hours']:.1f} h of run time in all (each run's seconds in "
                "lab.json, preparation not counted)." if verdict.get("run_hours") else ""), "",
             f"**Primary: {primary['difference']} = {primary['mean']:+.3f}, 95% CI [{primary['ci'][0]:+.3f}, "
             f"{primary['ci'][1]:+.3f}], p = {primary['p']:.3f} over {primary['seeds']} seeds: {primary['in_words']}.**",
             "", "| difference | seeds | mean | 95% CI | p | by the plan's rule |", "|---|---|---|---|---|---|",
             _row(primary)]
    lines += [_row(r) for r in verdict["secondary"] if "difference" in r]
    for r in verdict["secondary"]:
        if "fell" in r:
            lines += ["", f"Static fell (final below its seed's rule final by more than {r['margin']:.2f}) in "
                          f"{len(r['fell'])} of {r['seeds']} seeds" + (f": seeds {', '.join(map(str, r['fell']))}."
                                                                     if r["fell"] else ".")]
    if verdict["elsewhere"]:
        lines += ["", "Read elsewhere: " + "; ".join(verdict["elsewhere"]) + "."]
    seeds = sorted({s for by_seed in verdict["finals"].values() for s in by_seed}, key=int)
    lines += ["", "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for arm, by_seed in verdict["finals"].items():
        lines.append(f"| {arm} | " + " | ".join(f"{by_seed[s]:.3f}" if s in by_seed else "-" for s in seeds) + " |")
    return "\n".join(lines) + "\n"
