"""The report's text: report.md (tables and the figures) and summary.json (the same numbers, unrounded).

Tables:
  accuracy per arm  final and best accuracy, mean +- std over seeds (held-out, or the labelled fallback)
  runs              arm, seed, steps, final gap (training / held-out rollouts), hacking alarms, held-out
                    accuracy first / when the alarm first fired / lowest (step), status (failed runs: path, why)
  hacking signature per RM run: RM reward first -> last (window means), held-out accuracy first -> last, and
                    whether it shows the paper's signature (`aggregate.hacking_signature`), counted per arm
  rollout logs      rollouts, verified, rewarded-but-unverified, valid pairs; and the highest-rewarded
                    unverified rollouts of each RM run's last step (what a hacked reward pays for)
"""

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from cooper_openrlhf.algo.metric_keys import GAP, HELDOUT_GAP, RM_REWARD
from cooper_openrlhf.report.aggregate import (
    HELDOUT_LABEL,
    SIGNATURE_WINDOW,
    SIGNATURE_Z,
    VERIFIED_LABEL,
    ArmSummary,
    Signature,
    alarm_steps,
    alarm_timing,
    hacking_signature,
    heldout_series,
    summarize_arm,
)
from cooper_openrlhf.report.seed_stats import FINAL_EVALUATIONS, final_value, paired_comparison
from cooper_openrlhf.report.rm_measures import rm_section, rm_summary
from cooper_openrlhf.report.runs import RunData

RULE_ARM = "rule"  # the arm whose final held-out accuracy the signature compares against (lab/presets.py)
EXAMPLES_PER_RUN = 3
EXAMPLE_CHARS = 300
FIGURE_CAPTIONS = {
    "rewards_accuracy.png": "RM reward, verified accuracy of the same training rollouts, and held-out accuracy. "
                            "Hacking shows as RM reward rising while verified and held-out accuracy fall.",
    "rm_pair_accuracy.png": "The RM's pairwise accuracy on each step's fresh (verified-correct, wrong) pairs, "
                            "measured before it trains on them (Cooper runs only).",
    "hacking_gap.png": "RM reward minus verified accuracy on the training rollouts (the rug under it: steps where "
                       "the hacking guard's alarm was on, cooper/hacking_alarm) and on the held-out rollouts.",
    "step_time.png": "Seconds per step by stage (timing/*), stacked: where each arm's time goes.",
    "exploit_rate.png": "The share of each step's training rollouts written in the lab's answer style S, and the "
                        "share in S and verified wrong: the exploit a blind RM pays (a style plan's measure).",
    "rm_robustness.png": "RM robustness (report/robustness.py): each saved RM's premium over canonical wrong answers "
                         "on the probe suite's forms (rm/probes.py), step by step; black: right answers. An attack "
                         "near the black line is paid like a right answer; near 0 the RM refuses it.",
}


def number(mean: float, std: float | None, seeds: int) -> str:
    """'0.4375 ± 0.0312 (n=3)', or '0.4375 (n=1)' without a spread."""
    return f"{mean:.4f} (n={seeds})" if std is None else f"{mean:.4f} ± {std:.4f} (n={seeds})"


def arm_summaries(runs: Sequence[RunData]) -> list[ArmSummary]:
    arms: dict[str, list[RunData]] = {}
    for run in runs:
        if not run.failed:
            arms.setdefault(run.arm, []).append(run)
    summaries = [summarize_arm(arm, [r.scalars for r in arm_runs]) for arm, arm_runs in arms.items()]
    return [s for s in summaries if s is not None]


def _accuracy_section(summaries: list[ArmSummary]) -> list[str]:
    lines = ["## Accuracy per arm", ""]
    if not summaries:
        return lines + ["No run logged held-out or verified accuracy.", ""]
    fallback = [s.arm for s in summaries if s.metric == VERIFIED_LABEL]
    if len(fallback) == len(summaries):
        lines += ["No run logged held-out accuracy (`eval/accuracy` or `eval/<name>/accuracy`): the table uses the "
                  "rule-verified accuracy of the training rollouts (`cooper/verified_accuracy`) instead. That is not "
                  "a held-out result.", ""]
    elif fallback:
        lines += [f"No held-out accuracy for {', '.join(fallback)}: those rows use the rule-verified accuracy of the "
                  "training rollouts instead (labelled), so compare them with the others with care.", ""]
    lines += [f"Final = the mean of each seed's last {FINAL_EVALUATIONS} logged values (one evaluation is noisy); best = "
              "the maximum over its steps; mean ± sample std over seeds, and a 95% bootstrap interval of the mean.",
              "", "| arm | metric | final | final, 95% CI | best |", "|---|---|---|---|---|"]
    for s in summaries:
        label = "held-out accuracy" if s.metric == HELDOUT_LABEL else "verified accuracy (training rollouts)"
        interval = "-" if s.seeds < 2 else f"[{s.final_interval[0]:.3f}, {s.final_interval[1]:.3f}]"
        lines.append(f"| {s.arm} | {label} | {number(s.final_mean, s.final_std, s.seeds)} | {interval} | "
                     f"{number(s.best_mean, s.best_std, s.seeds)} |")
    return lines + [""]


BASELINE_ARMS = (RULE_ARM, "static")  # every other arm is compared with these, seed by seed


def _paired_section(runs: Sequence[RunData]) -> list[str]:
    """Each arm minus the rule arm and minus the static arm, seed by seed, with what is within noise in words."""
    finals: dict[str, dict[int, float]] = {}
    for run in runs:
        curve = heldout_series(run.scalars) if not run.failed else []
        if curve:
            finals.setdefault(run.arm, {})[run.seed] = final_value(curve)
    rows, noise, apart = [], [], []
    for baseline in BASELINE_ARMS:
        for arm in finals:
            if arm == baseline or baseline not in finals:
                continue
            compared = paired_comparison(finals[arm], finals[baseline])
            if compared is None:
                continue
            low, high = compared.interval
            verdict = "within noise" if compared.within_noise else "apart"
            rows.append(f"| {arm} | {baseline} | {compared.seeds} | {compared.mean_difference:+.3f} | "
                        f"[{low:+.3f}, {high:+.3f}] | {compared.p_value:.3f} | {verdict} |")
            (noise if compared.within_noise else apart).append(f"{arm} vs {baseline} ({compared.mean_difference:+.3f})")
    if not rows:
        return []
    lines = ["## Paired differences (held-out, final)", "",
             "Each arm minus the rule arm and minus the static arm, over the seeds both ran (a seed fixes the prompt "
             "order, so its arms meet the same problems): the mean difference, a 95% bootstrap interval over those "
             "seeds and a two-sided sign-flip permutation p-value. Within noise = the interval includes 0 or p >= 0.05 "
             "(the pre-registered plans' rule, report/seed_stats.py). Many comparisons, not corrected for their "
             "number: exploratory (a plan's own test is `cli.batch PLAN --verdict`).", "",
             "| arm | minus | seeds | mean difference | 95% CI | p | |", "|---|---|---|---|---|---|---|", *rows, ""]
    lines.append("Within noise: " + ("; ".join(noise) if noise else "none") + ". Apart: "
                 + ("; ".join(apart) if apart else "none") + ".")
    return lines + [""]


def _runs_section(runs: Sequence[RunData]) -> list[str]:
    lines = ["## Runs", "", "| arm | seed | steps | final gap: training / held-out | hacking alarms | "
             "held-out: first / at first alarm / "
             "lowest (step) | status | path |", "|---|---|---|---|---|---|---|---|"]
    show = lambda value: "-" if value is None else f"{value:.2f}"  # noqa: E731
    for run in runs:
        if run.failed:
            lines.append(f"| {run.arm} | {run.seed} | - | - | - | - | **failed**: {run.error} | `{run.path}` |")
            continue
        timing = alarm_timing(run.scalars)
        heldout = ("-" if timing.first is None else
                   f"{show(timing.first)} / {show(timing.at_first_alarm)} / {show(timing.lowest)} (step {timing.lowest_step})")
        steps = sorted({step for points in run.scalars.values() for step, _ in points})
        gap, heldout_gap = run.scalars.get(GAP), run.scalars.get(HELDOUT_GAP)
        gaps = " / ".join(f"{points[-1][1]:+.4f}" if points else "-" for points in (gap, heldout_gap))
        alarms = alarm_steps(run.scalars)
        alarm_text = (f"{len(alarms)} (first at step {alarms[0]})" if alarms
                      else "0" if "cooper/hacking_alarm" in run.scalars else "not monitored")
        lines.append(f"| {run.arm} | {run.seed} | {len(steps)} (last {steps[-1]}) | "
                     f"{gaps if gap or heldout_gap else '-'} | {alarm_text} | {heldout} | ok | `{run.path}` |")
    return lines + [""] + alarm_counts(runs)


def alarm_counts(runs: Sequence[RunData]) -> list[str]:
    """Steps with the hacking alarm on, per monitored run, arm by arm in seed order: how often the alarm would have
    stopped or switched each arm (`--cooper.on_hacking`), which the run table's first-alarm step does not say."""
    by_arm: dict[str, list[tuple[int, int, int]]] = {}
    for run in runs:
        if not run.failed and "cooper/hacking_alarm" in run.scalars:
            steps = len({step for points in run.scalars.values() for step, _ in points})
            by_arm.setdefault(run.arm, []).append((run.seed, len(alarm_steps(run.scalars)), steps))
    if not by_arm:
        return []
    parts = [f"{arm} {', '.join(str(n) for _, n, _ in sorted(rows))} (of {max(s for _, _, s in rows)} steps; seeds "
             f"{', '.join(str(seed) for seed, _, _ in sorted(rows))})" for arm, rows in by_arm.items()]
    return ["Steps with the hacking alarm on, per run: " + "; ".join(parts) + ".", ""]




def signatures(runs: Sequence[RunData], summaries: list[ArmSummary]) -> list[tuple[RunData, Signature]]:
    """`hacking_signature` of every finished run whose RM paid its policy, against the rule arm's held-out mean."""
    rule = next((s.final_mean for s in summaries if s.arm == RULE_ARM and s.metric == HELDOUT_LABEL), None)
    return [(run, hacking_signature(run.scalars, rule)) for run in runs if not run.failed and run.scalars.get(RM_REWARD)]


def _signature_section(runs: Sequence[RunData], summaries: list[ArmSummary]) -> list[str]:
    judged = signatures(runs, summaries)
    if not judged:
        return []
    rule = judged[0][1].rule_final
    lines = ["## The hacking signature", "",
             "The paper's signature of reward hacking, per RM run: the RM reward rises (its least-squares line over "
             f"the run rises by more than {SIGNATURE_Z:g} standard errors; first and last are the means of "
             f"{SIGNATURE_WINDOW} steps) while held-out accuracy ends below its first evaluation and below the rule arm's mean "
             + (f"final ({rule:.4f})." if rule is not None else "final (no rule arm here: not judged)."), ""]
    counts: dict[str, list[bool]] = {}
    for run, sig in judged:
        if sig.shows is not None:
            counts.setdefault(run.arm, []).append(sig.shows)
    lines += [f"- {arm}: in {sum(shown)} of {len(shown)} run(s)" for arm, shown in counts.items()] + [""]
    show = lambda value: "-" if value is None else f"{value:.2f}"  # noqa: E731
    lines += ["| arm | seed | RM reward: first -> last | line's rise ± se | held-out: first -> last | signature |",
              "|---|---|---|---|---|---|"]
    verdict = {True: "**yes**", False: "no", None: "-"}
    for run, sig in judged:
        rise = "-" if sig.rm_change is None else f"{sig.rm_change:+.2f} ± {sig.rm_change_se:.2f} ({verdict[sig.rm_rises]})"
        lines.append(f"| {run.arm} | {run.seed} | {show(sig.rm_first)} -> {show(sig.rm_last)} | {rise} | "
                     f"{show(sig.heldout_first)} -> {show(sig.heldout_last)} | {verdict[sig.shows]} |")
    return lines + [""]


def _clip(text: str) -> str:
    return text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + " [...]"


def _example(row: dict) -> list[str]:
    question = " ".join(_clip(str(row.get("question", ""))).split()).replace("`", "'")
    completion = _clip(str(row.get("completion", ""))).replace("```", "'''")  # cannot close the fence
    return [f"- reward {float(row['reward']):.3f}, reference `{row.get('reference', '')}`, question: {question}", "",
            "  ```text", *[f"  {line}" for line in completion.splitlines() or [""]], "  ```", ""]


def _rollouts_section(runs: Sequence[RunData]) -> list[str]:
    logged = [run for run in runs if run.rollouts is not None]
    if not logged:
        return ["## Rollout logs", "", "No run has a rollouts.jsonl (`--cooper.sample_log_dir`).", ""]
    lines = ["## Rollout logs", "", "From `--cooper.sample_log_dir`: every logged rollout of the run.", "",
             "| arm | seed | steps | rollouts | verified | reward >= 0.5 but not verified | valid pairs |",
             "|---|---|---|---|---|---|---|"]
    for run in logged:
        log = run.rollouts
        share = (lambda k, n: f"{k} ({k / n:.1%})" if n else "0")
        pairs = share(log.valid_pairs, log.pairs) + f" of {log.pairs}" if log.pairs else "-"
        lines.append(f"| {run.arm} | {run.seed} | {log.steps} | {log.rollouts} | {share(log.verified, log.rollouts)} | "
                     f"{share(log.rewarded_unverified, log.rollouts)} | {pairs} |")
    lines.append("")
    for run in logged:
        unverified = sorted((r for r in run.rollouts.last_step_rows if not r.get("verified") and r["reward"] >= 0.5),
                            key=lambda r: -float(r["reward"]))[:EXAMPLES_PER_RUN]
        if unverified:
            lines += [f"Highest-rewarded unverified rollouts of {run.arm} seed {run.seed}, step "
                      f"{run.rollouts.last_step}:", ""]
            for row in unverified:
                lines += _example(row)
    return lines


def render(runs: Sequence[RunData], summaries: list[ArmSummary], figures: Sequence[Path]) -> str:
    failed = sum(run.failed for run in runs)
    arms = sorted({run.arm for run in runs})
    head = ["# Run report", "", f"{len(runs)} run(s) of {len(arms)} arm(s) ({', '.join(arms)}); "
            f"{failed} failed{' (listed under Runs, not plotted)' if failed else ''}.", ""]
    figure_lines = ["## Figures", ""]
    for path in figures:
        figure_lines += [f"![{path.stem}]({path.name})", "", FIGURE_CAPTIONS.get(path.name, ""), ""]
    body = (head + _accuracy_section(summaries) + _paired_section(runs) + _runs_section(runs)
            + _signature_section(runs, summaries) + rm_section(runs)
            + figure_lines + _rollouts_section(runs))
    return "\n".join(body).rstrip() + "\n"


def summary_json(runs: Sequence[RunData], summaries: list[ArmSummary]) -> dict:
    """The report's numbers, unrounded, for scripts (the lab)."""
    return {
        "arms": [asdict(s) for s in summaries],
        "runs": [{"arm": r.arm, "seed": r.seed, "path": r.path, "failed": r.failed, "error": r.error,
                  "steps": sorted({s for points in r.scalars.values() for s, _ in points}),
                  "hacking_alarm_steps": alarm_steps(r.scalars), "heldout_alarm_timing": asdict(alarm_timing(r.scalars))}
                 for r in runs],
        "hacking_signature": [{"arm": run.arm, "seed": run.seed, **asdict(sig)} for run, sig in signatures(runs, summaries)],
        "rm": rm_summary(runs),  # report/rm_measures.py: the degenerate test and the measures that keep right answers
    }


def write_markdown(runs: Sequence[RunData], figures: Sequence[Path], out_dir: Path) -> tuple[Path, Path]:
    """Write report.md and summary.json into out_dir; returns their paths."""
    summaries = arm_summaries(runs)
    report, summary = out_dir / "report.md", out_dir / "summary.json"
    report.write_text(render(runs, summaries, figures), encoding="utf-8")
    summary.write_text(json.dumps(summary_json(runs, summaries), indent=2) + "\n", encoding="utf-8")
    return report, summary
