"""The test of a plan whose primaries form a fixed sequence (a plan's "sequence", as the probe lab's in docs/lab/), read
off runs spread over several lab folders, one per preparation.

A plan of this kind blocks its seeds by preparation: every lab folder (`plan["labs"]`) is one preparation with its
own RL seeds 0..k-1, so a seed is named by both, "<lab>/<seed>", and a paired difference pairs two arms' runs of one
preparation and one RL seed. The sequence itself is `plan_verdict.sequential_primaries` (fixed-sequence
gatekeeping, Holm within each entry); the plan's "secondary" differences are one Holm family of their own; its
"descriptive" entries are listed as read elsewhere (the report's curves). Nothing here chooses a rule: each entry's
decision wording is checked against the measure's (`plan_verdict.decision_rule`).
"""

from pathlib import Path

from cooper_openrlhf.report.plan_verdict import _compare, arm_summaries, holm_adjusted, sequential_primaries
from cooper_openrlhf.report.registered_measures import (DEGENERATE_RM, FINAL_PROBE_PREMIUM, MEASURE_LABELS,
                                                        PROBE_RIGHT_EXPLOIT, RM_AUC_EXPLOIT, RM_DISCRIMINATION,
                                                        lab_finals)

# The entries that read the RM itself: beside each, the plan's registered costs ("costs": measures such as
# registered_measures.ORDINARY_WRONG_PAY and DEGENERATE_RM), so an RM that closed a blind spot by breaking is seen as
# broken.
RM_SIDE = (FINAL_PROBE_PREMIUM, RM_DISCRIMINATION, RM_AUC_EXPLOIT, PROBE_RIGHT_EXPLOIT)


def pooled_finals(out: Path, labs: list[dict], measure: str, style: str | None = None) -> dict[str, dict[str, float]]:
    """{arm: {"<lab>/<seed>": value}} over the plan's lab folders under `out` (a lab not yet run adds nothing)."""
    pooled: dict[str, dict[str, float]] = {}
    for lab in labs:
        folder = out / lab["name"]
        if not folder.is_dir():
            continue
        for arm, by_seed in lab_finals(folder, measure, style).items():
            pooled.setdefault(arm, {}).update({f"{lab['name']}/{seed}": value for seed, value in by_seed.items()})
    return pooled


def sequence_measures(plan: dict) -> list[str]:
    """Every measure the plan's test reads: the sequence's, then its secondary entries'."""
    named = [entry["measure"] for entry in plan["sequence"]]
    named += [entry["measure"] for entry in plan.get("secondary", []) if isinstance(entry, dict)]
    named += list(plan.get("costs", []))
    return list(dict.fromkeys(named))


def sequence_verdict(plan: dict, by_measure: dict[str, dict[str, dict[str, float]]]) -> dict:
    """The sequence's results, the secondary family (Holm over all its differences, each in its own measure), and
    each arm's summary in every measure read. `by_measure`: {measure: `pooled_finals`}."""
    sequence = sequential_primaries({"primaries": plan["sequence"]}, by_measure)
    for entry, record in zip(plan["sequence"], sequence):
        record["role"] = entry.get("role", "primary")
    entries = [e for e in plan.get("secondary", []) if isinstance(e, dict)]
    own_p = [_compare(by_measure[e["measure"]], e["difference"])["p"] for e in entries]
    secondary = []
    for entry, p_holm in zip(entries, holm_adjusted(own_p)):
        result = _compare(by_measure[entry["measure"]], entry["difference"], p_holm)
        secondary.append({**result, "measure": entry["measure"]})  # "a above b": a secondary names no control
    costs = {measure: {arm: {"seeds": len(by_seed), "sum": sum(by_seed.values()),
                             "mean": sum(by_seed.values()) / len(by_seed)}
                       for arm, by_seed in sorted(by_measure[measure].items()) if by_seed}
             for measure in plan.get("costs", [])}
    return {"commit": plan.get("commit"), "sequence": sequence, "secondary": secondary,
            **({"costs": costs} if costs else {}),  # a plan that registered none reads as it was written
            "elsewhere": list(plan.get("descriptive", [])),
            "arms": {measure: arm_summaries(finals) for measure, finals in by_measure.items()},
            "finals": {measure: {arm: dict(sorted(by_seed.items())) for arm, by_seed in finals.items()}
                       for measure, finals in by_measure.items()}}


def _row(result: dict) -> str:
    low, high = result["ci"]
    holm = f"{result['p_holm']:.3f}" if "p_holm" in result else "-"
    return (f"| {result['difference']} | {result['seeds']} | {result['mean']:+.3f} | [{low:+.3f}, {high:+.3f}] | "
            f"{result['p']:.3f} | {holm} | {result['in_words']} |")


def _label(measure: str) -> str:
    return MEASURE_LABELS.get(measure, measure)


def costs_lines(costs: dict) -> list[str]:
    """The registered costs, one row per arm: each cost's mean over seeds; the degenerate RMs as a count."""
    if not costs:
        return []
    lines = ["| arm | " + " | ".join(_label(m) for m in costs) + " |", "|---|" + "---|" * len(costs)]
    for arm in sorted({arm for by_arm in costs.values() for arm in by_arm}):
        cells = []
        for measure, by_arm in costs.items():
            cost = by_arm.get(arm)
            cells.append("-" if cost is None else f"{round(cost['sum'])} of {cost['seeds']}"
                         if measure == DEGENERATE_RM else f"{cost['mean']:.3f} (n {cost['seeds']})")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return ["Registered costs beside it (the plan's \"costs\"):", "", *lines, ""]


def render_sequence(verdict: dict, plan_path: str = "") -> str:
    lines = [f"# The plan's test{f' ({plan_path})' if plan_path else ''}", "",
             "Seeds are blocked by preparation: each difference pairs two arms' runs of one preparation and one RL "
             "seed (\"prep<p>/<seed>\"). 95% percentile bootstrap CI over those pairs (10000 resamples), exact "
             "two-sided sign-flip p. The entries of the sequence are tested in their registered order; each is a "
             "Holm family, and a later entry is tested only on the arms that beat the control in the one before."
             + (f" Configuration frozen at commit `{verdict['commit']}`." if verdict.get("commit") else ""), ""]
    for number, record in enumerate(verdict["sequence"], 1):
        lines += [f"## {number}. {record['role']}: {_label(record['measure'])}", "", f"Measure: {record['measure']}.",
                  ""]
        if not record["tested"]:
            lines += [f"Not tested: {record['why'].removeprefix('not tested: ')}.", ""]
            continue
        for gate in record["validity_gates"]:
            lines.append(f"Validity gate: {gate['difference']} must be {gate['must_be']}: {gate['mean']:+.3f} "
                         f"[{gate['ci'][0]:+.3f}, {gate['ci'][1]:+.3f}], p {gate['p']:.3f}, {gate['verdict']}: "
                         + ("passed." if gate["passed"] else "failed, so this entry is uninformative."))
        lines += ["", "| difference | seeds | mean | 95% CI | p | Holm p | by the plan's rule |",
                  "|---|---|---|---|---|---|---|", *map(_row, record["results"]), ""]
        if record["measure"] in RM_SIDE:
            lines += costs_lines(verdict.get("costs", {}))
    if verdict["secondary"]:
        lines += ["## Secondary differences (one Holm family, each in its own measure)", "",
                  "| difference | seeds | mean | 95% CI | p | Holm p | by the plan's rule |",
                  "|---|---|---|---|---|---|---|"]
        lines += [_row({**r, "difference": f"{r['difference']} ({_label(r['measure'])})"})
                  for r in verdict["secondary"]]
        lines.append("")
    if verdict["elsewhere"]:
        lines += ["Descriptive, read elsewhere: " + "; ".join(verdict["elsewhere"]) + ".", ""]
    lines += ["## Each arm over its seeds", "", "Mean ± sd [95% bootstrap CI of the mean].", "",
              "| arm | " + " | ".join(_label(m) for m in verdict["arms"]) + " |", "|---|" + "---|" * len(verdict["arms"])]
    for arm in sorted({arm for by_arm in verdict["arms"].values() for arm in by_arm}):
        cells = [f"{a['mean']:.3f} ± {a['sd']:.3f} [{a['ci'][0]:.3f}, {a['ci'][1]:.3f}] (n {a['seeds']})"
                 if (a := by_arm.get(arm)) else "-" for by_arm in verdict["arms"].values()]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
