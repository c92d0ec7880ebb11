"""A pre-registered plan's test, read off its finished runs: the primary difference judged by the plan's decision
rule, the secondary differences (Holm-corrected as one family), an equivalence test where the plan registers one, and
how often the static arm fell (a plan's "primary", "secondary" and "equivalence" entries, docs/lab/<batch>/plan.json:
the full lab's and the style lab's plans).

The decision rule is the one the plan states, in code (`decide`); `check_decision_rule` refuses a plan whose rule
is worded otherwise, so the verdict can never be judged by a rule other than the one written before the runs.
The statistics are the report's (`report.seed_stats`): a 95% percentile bootstrap interval over seeds (10000
resamples) and the exact two-sided sign-flip p-value; "within noise" is `PairedComparison.within_noise`, the one
definition every report uses. The measure is the plan's, by its exact wording (`report/registered_measures.py`
reads each from the runs); where less is better (`LOWER_IS_BETTER`) a plan states the rule with the sides turned
(`DECISION_RULE_LOWER`).

Secondary differences are many tests of one batch: each is judged with its Holm-adjusted p (`holm_adjusted`) over
the plan's secondary differences, so "apart" there means what it would mean alone. The full lab's plan registered no
correction; its secondaries read with Holm now are labelled as such in the verdict.
"""

import json
import re
import statistics
from pathlib import Path

from cooper_openrlhf.report.registered_measures import HELDOUT_FINAL, LOWER_IS_BETTER, MEASURE_LABELS
from cooper_openrlhf.report.seed_stats import (ALPHA, PairedComparison, bootstrap_mean_interval, equivalence_p_value,
                                               paired_comparison)

DECISION_RULE = ("beats the control if CI lower end > 0 and p < 0.05; worse if CI upper end < 0 and p < 0.05; "
                 "else within noise")
_DIFFERENCE = re.compile(r"^\s*([a-z_]+)\s+-\s+([a-z_]+)\b")
_STATIC_FALLS = re.compile(r"^static falls: final below its seed's rule final by more than ([0-9.]+)")
DECISION_RULE_LOWER = ("beats the control if CI upper end < 0 and p < 0.05; worse if CI lower end > 0 and p < 0.05; "
                       "else within noise")


def holm_adjusted(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values, in their order (each then compared with ALPHA)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def parse_difference(text: str) -> tuple[str, str]:
    """"cooper - offline_pairs, paired by seed" -> ("cooper", "offline_pairs")."""
    match = _DIFFERENCE.match(text)
    if not match:
        raise ValueError(f"not a difference of two arms ('<arm> - <arm>'): {text!r}")
    return match.group(1), match.group(2)


def decision_rule(measure: str) -> str:
    """The decision rule this tool applies to a primary in `measure` (which way is better decides its wording)."""
    return DECISION_RULE_LOWER if measure in LOWER_IS_BETTER else DECISION_RULE


def check_decision_rule(plan: dict) -> None:
    stated, rule = " ".join(plan["primary"]["decision"].split()), decision_rule(plan_measure(plan))
    if stated != rule:
        raise ValueError(f"the plan's decision rule is {stated!r}; for its measure this tool decides by {rule!r} only")


def decide(comparison: PairedComparison) -> str:
    """The plan's rule for A - B: "above" (A beats the control B), "below" (A is worse), or "within noise"
    (`PairedComparison.within_noise`: the interval includes 0, or p is not below 0.05)."""
    if comparison.within_noise:
        return "within noise"
    return "above" if comparison.interval[0] > 0 else "below"


PRIMARY_WORDS = {"above": "beats the control", "below": "worse than the control", "within noise": "within noise"}
PRIMARY_WORDS_LOWER = {"below": "beats the control", "above": "worse than the control", "within noise": "within noise"}


def _paired(finals: dict[str, dict[int, float]], text: str) -> tuple[str, str, PairedComparison]:
    a, b = parse_difference(text)
    missing = [arm for arm in (a, b) if arm not in finals]
    if missing:
        raise ValueError(f"{text!r}: no finished run of {', '.join(missing)} (arms with runs: {', '.join(sorted(finals))})")
    compared = paired_comparison(finals[a], finals[b])
    if compared is None:
        raise ValueError(f"{text!r}: {a} and {b} share fewer than 2 seeds")
    return a, b, compared


def _compare(finals: dict[str, dict[int, float]], text: str, holm_p: float | None = None) -> dict:
    """A - B by the plan's rule; with `holm_p`, judged with that (Holm-adjusted) p instead of its own."""
    a, b, compared = _paired(finals, text)
    judged = compared if holm_p is None else PairedComparison(compared.seeds, compared.mean_difference,
                                                              compared.interval, holm_p)
    verdict = decide(judged)
    return {"difference": f"{a} - {b}", "seeds": compared.seeds, "mean": compared.mean_difference,
            "ci": list(compared.interval), "p": compared.p_value, **({"p_holm": holm_p} if holm_p is not None else {}),
            "verdict": verdict,
            "in_words": {"above": f"{a} above {b}", "below": f"{a} below {b}"}.get(verdict, verdict)}


def equivalence(finals: dict[str, dict[int, float]], entry: dict) -> dict:
    """A plan's registered equivalence test ({"difference": "a - b", "margin": m}): two one-sided sign-flip tests
    (`seed_stats.equivalence_p_value`); "equivalent" when p < 0.05, i.e. both one-sided tests reject a difference
    as large as the margin."""
    margin = float(entry["margin"])
    a, b, compared = _paired(finals, entry["difference"])
    seeds = sorted(set(finals[a]) & set(finals[b]))
    p = equivalence_p_value([finals[a][s] - finals[b][s] for s in seeds], margin)
    return {"entry": entry["difference"], "difference": f"{a} - {b}", "margin": margin, "seeds": compared.seeds,
            "mean": compared.mean_difference, "ci": list(compared.interval), "p": p,
            "verdict": "equivalent" if p < ALPHA else "not shown equivalent"}


def static_falls(finals: dict[str, dict[int, float]], margin: float) -> dict:
    """Seeds whose static final is below the same seed's rule final by more than `margin`."""
    seeds = sorted(set(finals.get("static", {})) & set(finals.get("rule", {})))
    fell = [s for s in seeds if finals["rule"][s] - finals["static"][s] > margin]
    return {"margin": margin, "seeds": len(seeds), "fell": fell}


def arm_summaries(finals: dict[str, dict[int, float]]) -> dict[str, dict]:
    """Each arm over its seeds: mean, sample sd and the 95% bootstrap interval of the mean (the report's)."""
    summaries = {}
    for arm, by_seed in sorted(finals.items()):
        values = [by_seed[s] for s in sorted(by_seed)]
        summaries[arm] = {"seeds": len(values), "mean": statistics.fmean(values),
                          "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                          "ci": list(bootstrap_mean_interval(values))}
    return summaries


def plan_measure(plan: dict) -> str:
    """The plan's primary measure, by its wording (MEASURES); a plan that names none is the full lab's kind."""
    return plan["primary"].get("measure", HELDOUT_FINAL)


def plan_measures(plan: dict) -> list[str]:
    """Every measure the plan's test reads: the primary's, then those its secondary entries name
    ({"difference", "measure"} entries; a plain string is a difference in the primary's measure)."""
    named = [e["measure"] for e in plan.get("secondary", []) if isinstance(e, dict)]
    return list(dict.fromkeys([plan_measure(plan), *named]))


def _entry_text(entry: str | dict) -> str:
    return entry if isinstance(entry, str) else f"{entry['difference']} ({entry['measure']})"


def plan_verdict(plan: dict, finals: dict[str, dict[int, float]],
                 other_finals: dict[str, dict[str, dict[int, float]]] | None = None) -> dict:
    """The plan's primary test, its secondary entries that are differences (Holm-corrected as one family) or the
    static-falls count, and its registered equivalence test; any other secondary entry is listed as read elsewhere
    (e.g. the blind-spot figure). `finals`: each arm's seeds' values of the plan's measure; `other_finals`: the same
    for each other measure its secondary entries name (`plan_measures`)."""
    check_decision_rule(plan)
    by_measure = {plan_measure(plan): finals, **(other_finals or {})}

    def finals_of(entry):
        return by_measure[entry["measure"]] if isinstance(entry, dict) else finals

    def text_of(entry):
        return entry["difference"] if isinstance(entry, dict) else entry

    differences = [e for e in plan.get("secondary", [])
                   if isinstance(e, dict) or (not _STATIC_FALLS.match(e) and _DIFFERENCE.match(e))]
    own_p = [_compare(finals_of(e), text_of(e))["p"] for e in differences]
    holm = dict(zip(map(_entry_text, differences), holm_adjusted(own_p)))
    secondary, elsewhere = [], []
    for entry in plan.get("secondary", []):
        falls = _STATIC_FALLS.match(entry) if isinstance(entry, str) else None
        if falls:
            secondary.append({"entry": entry, **static_falls(finals, float(falls.group(1)))})
        elif _entry_text(entry) in holm:
            result = _compare(finals_of(entry), text_of(entry), holm[_entry_text(entry)])
            if isinstance(entry, dict):
                result["difference"] += f" ({entry['measure']})"
            secondary.append({"entry": _entry_text(entry), **result})
        else:
            elsewhere.append(entry)
    primary = _compare(finals, plan["primary"]["difference"])
    words = PRIMARY_WORDS_LOWER if plan_measure(plan) in LOWER_IS_BETTER else PRIMARY_WORDS
    primary["in_words"] = words[primary["verdict"]]
    gate = plan["primary"].get("validity_gate")
    if gate:  # the primary counts only if the control was hurt, as registered ({"difference", "must_be"})
        checked = _compare(finals, gate["difference"])
        primary["validity_gate"] = {**gate, **{k: checked[k] for k in ("mean", "ci", "p", "verdict")},
                                    "passed": checked["verdict"] == gate["must_be"]}
        if not primary["validity_gate"]["passed"]:
            primary["verdict"] = "uninformative"
            primary["in_words"] = (f"uninformative: the validity gate failed ({checked['difference']} "
                                   f"{checked['mean']:+.3f}, p {checked['p']:.3f}: {checked['verdict']}, not "
                                   f"{gate['must_be']}), so the control was not shown hurt")
    return {"lab": plan["primary"]["lab"], "commit": plan.get("commit"), "measure": plan_measure(plan),
            "primary": {"entry": plan["primary"]["difference"], **primary},
            "secondary": secondary, "elsewhere": elsewhere,
            "holm_registered": plan.get("secondary_correction") == "holm",
            "equivalence": [equivalence(finals, e) for e in plan.get("equivalence", [])],
            "arms": {measure: arm_summaries(by_arm) for measure, by_arm in by_measure.items()},
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
    holm = f"{result['p_holm']:.3f}" if "p_holm" in result else "-"
    return (f"| {result['difference']} | {result['seeds']} | {result['mean']:+.3f} | [{low:+.3f}, {high:+.3f}] | "
            f"{result['p']:.3f} | {holm} | {result['in_words']} |")


def render(verdict: dict, plan_path: str = "") -> str:
    primary = verdict["primary"]
    measure = verdict.get("measure", HELDOUT_FINAL)
    lines = [f"# The plan's test{f' ({plan_path})' if plan_path else ''}", "",
             f"Lab `{verdict['lab']}`; measure: {measure}; differences paired by seed, "
             "95% percentile bootstrap CI over seeds (10000 resamples), exact two-sided sign-flip p. Decision rule "
             f"(the plan's): {decision_rule(measure)}." + (f" Configuration frozen at commit `{verdict['commit']}`."
                                                     if verdict.get("commit") else "")
             + (f" The plan's labs' runs took {verdict['run_hours']:.1f} h of run time in all (each run's seconds in "
                "lab.json, preparation not counted)." if verdict.get("run_hours") else ""), "",
             f"**Primary: {primary['difference']} = {primary['mean']:+.3f}, 95% CI [{primary['ci'][0]:+.3f}, "
             f"{primary['ci'][1]:+.3f}], p = {primary['p']:.3f} over {primary['seeds']} seeds: {primary['in_words']}.**",
             "", "| difference | seeds | mean | 95% CI | p | Holm p | by the plan's rule |",
             "|---|---|---|---|---|---|---|", _row(primary)]
    secondary = [r for r in verdict["secondary"] if "difference" in r]
    lines += [_row(r) for r in secondary]
    if secondary:
        lines += ["", f"The secondary differences are judged with their Holm-adjusted p over the {len(secondary)} of "
                      "them (the primary is one test and keeps its own p). "
                  + ("The plan registered this correction." if verdict.get("holm_registered") else
                     "The plan registered no correction: the Holm column was added after its runs, and without it "
                     "the secondaries are exploratory.")]
    gate = primary.get("validity_gate")
    if gate:
        lines += ["", f"Validity gate (registered): {gate['difference']} must be {gate['must_be']} by the plan's rule: "
                      f"{gate['mean']:+.3f} [{gate['ci'][0]:+.3f}, {gate['ci'][1]:+.3f}], p {gate['p']:.3f}, "
                      f"{gate['verdict']}: {'passed' if gate['passed'] else 'failed, so the primary is uninformative'}."]
    for r in verdict.get("equivalence", []):
        low, high = r["ci"]
        lines += ["", f"Equivalence (registered in the plan): {r['difference']} = {r['mean']:+.3f} [{low:+.3f}, "
                      f"{high:+.3f}] over {r['seeds']} seeds; two one-sided sign-flip tests at a margin of "
                      f"±{r['margin']:.3f}: p = {r['p']:.3f}, {r['verdict']}."]
    for r in verdict["secondary"]:
        if "fell" in r:
            lines += ["", f"Static fell (final below its seed's rule final by more than {r['margin']:.2f}) in "
                          f"{len(r['fell'])} of {r['seeds']} seeds" + (f": seeds {', '.join(map(str, r['fell']))}."
                                                                     if r["fell"] else ".")]
    if verdict["elsewhere"]:
        lines += ["", "Read elsewhere: " + "; ".join(verdict["elsewhere"]) + "."]
    arms = verdict.get("arms", {})
    if arms:  # each arm alone, in every measure the plan's test reads (the primary's first)
        names = sorted({arm for by_arm in arms.values() for arm in by_arm})
        lines += ["", "Each arm over its seeds: mean ± sd [95% bootstrap CI of the mean], in the measures the plan's "
                      "test reads, the primary's first: " + "; ".join(f"{MEASURE_LABELS.get(m, m)} = {m}" for m in arms)
                  + ".", "", "| arm | " + " | ".join(MEASURE_LABELS.get(m, m) for m in arms) + " |",
                  "|---|" + "---|" * len(arms)]
        for arm in names:
            cells = [f"{a['mean']:.3f} ± {a['sd']:.3f} [{a['ci'][0]:.3f}, {a['ci'][1]:.3f}]" if (a := by_arm.get(arm))
                     else "-" for by_arm in arms.values()]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    seeds = sorted({s for by_seed in verdict["finals"].values() for s in by_seed}, key=int)
    lines += ["", "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for arm, by_seed in verdict["finals"].items():
        lines.append(f"| {arm} | " + " | ".join(f"{by_seed[s]:.3f}" if s in by_seed else "-" for s in seeds) + " |")
    return "\n".join(lines) + "\n"


def sequential_primaries(plan: dict, by_measure: dict[str, dict[str, dict[int, float]]]) -> list[dict]:
    """A plan's `primaries`, tested in their registered order (fixed-sequence gatekeeping), one result per entry.

    Each entry is a family of differences in one measure ({"measure", "differences": ["a - control", ...],
    "decision", "validity_gates": [{"difference", "must_be"}]}), each difference judged by the measure's decision
    rule with its Holm-adjusted p over the family. Its validity gates are read in its measure by the same rule; one
    that fails makes the entry "uninformative". A later entry is tested only on the arms (the first arm of each
    difference) that beat the control in the entry before it, and not at all when none did or that entry was
    uninformative: so each arm's family-wise error over the sequence stays at 0.05. `by_measure`: {measure: the
    finals of `lab_finals`}."""
    results, passing = [], None
    for entry in plan["primaries"]:
        measure = entry["measure"]
        stated = " ".join(entry["decision"].split())
        if stated != decision_rule(measure):
            raise ValueError(f"the plan's decision rule for {measure!r} is {stated!r}; for that measure this tool "
                             f"decides by {decision_rule(measure)!r} only")
        finals = by_measure[measure]
        texts = [t for t in entry["differences"] if passing is None or parse_difference(t)[0] in passing]
        record = {"measure": measure, "tested": bool(texts), "results": [], "validity_gates": []}
        results.append(record)
        if not texts:
            record["why"] = "not tested: no arm beat the control in the primary before it"
            passing = set()
            continue
        for gate in entry.get("validity_gates", []):
            checked = _compare(finals, gate["difference"])
            record["validity_gates"].append({**gate, **{k: checked[k] for k in ("mean", "ci", "p", "verdict")},
                                             "passed": checked["verdict"] == gate["must_be"]})
        words = PRIMARY_WORDS_LOWER if measure in LOWER_IS_BETTER else PRIMARY_WORDS
        own = [_compare(finals, t)["p"] for t in texts]
        for text, p in zip(texts, holm_adjusted(own)):
            result = _compare(finals, text, p)
            result["in_words"] = words[result["verdict"]]
            record["results"].append(result)
        if not all(g["passed"] for g in record["validity_gates"]):
            record["why"] = "uninformative: a validity gate failed"
            for result in record["results"]:
                result["verdict"], result["in_words"] = "uninformative", "uninformative (a validity gate failed)"
            passing = set()
            continue
        beat = "below" if measure in LOWER_IS_BETTER else "above"
        passing = {parse_difference(r["difference"])[0] for r in record["results"] if r["verdict"] == beat}
    return results
