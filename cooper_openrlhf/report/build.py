"""One report from run folders: read the runs, draw the figures, write report.md and summary.json; and the lines
printed about them.

The library behind `cli.report` and the lab's own report (`cli.lab`); neither CLI calls the other. `run_lines` says
what the given runs logged and nothing else: a user's own trainer run or reward service is not one of the lab's
arms, so neither the lab's reading against the paper nor its committed batches belong there (`cli.lab` prints
those for its own runs).
"""

import logging
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from cooper_openrlhf.algo.metric_keys import ACCURACY, ALARM, PAIR_ACCURACY, RM_REWARD, WRONG_REWARD
from cooper_openrlhf.report.aggregate import alarm_steps, heldout_series
from cooper_openrlhf.report.figures import SMOOTHING, write_figures
from cooper_openrlhf.report.markdown import write_markdown
from cooper_openrlhf.report.rm_health import write_rm_health
from cooper_openrlhf.report.robustness import write_robustness
from cooper_openrlhf.report.runs import RunData, load_run

logger = logging.getLogger("cooper_openrlhf.report")


def write_report(run_dirs: Sequence[str], out: Path, known_arms: Sequence[str] = (),
                 style: str | None = None) -> list[RunData]:
    """Read the runs, write the figures, report.md and summary.json into `out`; returns the runs. known_arms: arms
    whose colour is fixed in every report (the lab's); style: the lab's answer sentence S, for the exploit-rate
    figure."""
    runs = [load_run(path, style) for path in tqdm(run_dirs, desc="reading runs", unit="run")]
    for run in runs:
        if run.failed:
            logger.warning("run %s (%s seed %d) failed: %s", run.path, run.arm, run.seed, run.error)
    figures = write_figures(runs, out, known_arms=known_arms, style=style)
    robustness = write_robustness(runs, out)  # only runs that saved their RM (`<tag>_rm_hf`)
    if robustness is not None:
        figures.append(robustness)
    figures += [path for path in [write_rm_health(runs, out, known_arms)] if path]  # runs the RM guard measured
    report, summary = write_markdown(runs, figures, out)
    print(f"report: {report}\nsummary: {summary}\nfigures: " + ", ".join(str(p) for p in figures), flush=True)
    return runs


def _window_ends(curve) -> tuple[float, float, int] | None:
    """(mean of the first w values, mean of the last w, w) of one run's curve, w = SMOOTHING steps (the figures'
    trailing mean: a step's batch is a few prompts) or half the curve when shorter; None under two points."""
    values = [value for _, value in curve]
    width = min(SMOOTHING, len(values) // 2)
    if not width:
        return None
    return sum(values[:width]) / width, sum(values[-width:]) / width, width


def _arm_ends(curves, ends_of=_window_ends) -> tuple[float, float, int] | None:
    """`ends_of` averaged over an arm's runs (those with a long enough curve); the smallest window among them."""
    read = [ends for ends in map(ends_of, curves) if ends]
    if not read:
        return None
    return (sum(e[0] for e in read) / len(read), sum(e[1] for e in read) / len(read), min(e[2] for e in read))


def _first_last(curve) -> tuple[float, float, int] | None:
    """(first, last, count) of a sparse curve (held-out evaluations): no window, each evaluation is a whole set."""
    return (curve[0][1], curve[-1][1], len(curve)) if curve else None


def run_lines(runs: Sequence[RunData]) -> list[str]:
    """What each arm of the given runs logged, first -> last, as `cooper report` prints it: the training rollouts'
    RM reward, verified accuracy and the RM's pay of verified-wrong ones, the RM's pair accuracy, held-out accuracy,
    the hacking alarm; failed runs with their reason. Means over an arm's runs."""
    lines = ["What the runs logged (means over each arm's runs; report.md has the tables, the figures the curves):"]
    arms: dict[str, list[RunData]] = {}
    for run in runs:
        if run.failed:
            lines.append(f"{run.arm} (seed {run.seed}): not read: {run.error} ({run.path})")
        else:
            arms.setdefault(run.arm, []).append(run)
    explain_heldout = False
    for arm, members in arms.items():
        steps = sorted({step for run in members for series in run.scalars.values() for step, _ in series})
        where = members[0].path if len(members) == 1 else f"seeds {', '.join(str(r.seed) for r in members)}"
        lines.append(f"{arm} ({len(members)} run{'s' if len(members) > 1 else ''}, {len(steps)} logged steps, {where}):")
        training = [(name, _arm_ends([run.scalars.get(key, []) for run in members]))
                    for name, key in (("RM reward", RM_REWARD), ("verified accuracy", ACCURACY),
                                      ("RM pay of the verified-wrong ones", WRONG_REWARD))]
        training = [(name, ends) for name, ends in training if ends]
        if training:
            width = min(ends[2] for _, ends in training)
            lines.append(f"  training rollouts, first -> last {width} steps: "
                         + ", ".join(f"{name} {first:.2f} -> {last:.2f}" for name, (first, last, _) in training))
        pairs = _arm_ends([run.scalars.get(PAIR_ACCURACY, []) for run in members])
        if pairs:
            lines.append(f"  RM pair accuracy on each step's fresh pairs, before its update, first -> last {pairs[2]} "
                         f"steps: {pairs[0]:.2f} -> {pairs[1]:.2f}")
        heldout = _arm_ends([heldout_series(run.scalars) for run in members], _first_last)
        if heldout:
            lines.append(f"  held-out accuracy, first -> last of {heldout[2]} evaluations: {heldout[0]:.2f} -> "
                         f"{heldout[1]:.2f}")
            explain_heldout = True
        monitored = [run for run in members if ALARM in run.scalars]
        if monitored:
            on = sorted({step for run in monitored for step in alarm_steps(run.scalars)})
            lines.append("  hacking alarm: " + (f"on at {len(on)} steps, first at step {on[0]}" if on else "never on"))
    if explain_heldout:
        lines.append("Held-out accuracy is graded on the --eval.dataset prompts, never trained on, sampled at "
                     "--eval.temperature: it need not match the training rollouts' verified accuracy (docs/report.md, "
                     "\"Held-out against training accuracy\").")
    if not arms and len(lines) == 1:
        lines.append("no run given")
    return lines
