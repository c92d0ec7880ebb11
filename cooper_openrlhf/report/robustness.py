"""The RM robustness curve: what each saved RM of a run pays the probe suite's attack forms, against step.

A run that saved its RM (`<tag>_rm_hf` exports under its folder, --ckpt.save_hf) is read checkpoint by checkpoint
with the probe suite (rm/probes.py) built on the run's own problems (its held-out prompts when it logged them,
samples/heldout.jsonl, else its training prompts): per form the premium over canonical wrong answers. A form whose
premium falls towards 0 is one the RM has learnt to refuse; one that stays near the right answers' premium (drawn
black) is a blind spot open at that step. `rm_robustness.png` has one panel per run (`cli.report` adds it for
every run with RM exports; runs without are named in the panel list, not drawn).
"""

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from cooper_openrlhf.data.records import MathProblem  # noqa: E402
from cooper_openrlhf.ray.checkpoint_tags import tag_step  # noqa: E402
from cooper_openrlhf.rm.probes import ATTACKS, build_probes, probe_scorer  # noqa: E402

FIGURE = "rm_robustness.png"
PROBE_PROBLEMS = 16  # problems the suite is built on: ~20 probes each, a few seconds per checkpoint of a small RM
Curve = dict[str, list[tuple[int, float]]]  # form -> [(step, premium)], by step


def rm_exports(run_dir: Path) -> dict[int, Path]:
    """{step: RM export} of every `<tag>_rm_hf` folder under the run (either tag of a step will do)."""
    exports = {}
    for folder in sorted(Path(run_dir).rglob("*_rm_hf")):
        step = tag_step(folder.name[: -len("_rm_hf")])
        if isinstance(step, int) and (folder / "config.json").is_file():
            exports[step] = folder
    return exports


def run_problems(run_dir: Path, limit: int = PROBE_PROBLEMS) -> list[MathProblem]:
    """The run's distinct (question, reference) in log order: held-out first (prompts it never trained on)."""
    for name in ("heldout.jsonl", "rollouts.jsonl"):
        for log in sorted(Path(run_dir).rglob(name)):
            seen: dict[tuple[str, str], None] = {}
            for line in log.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    seen.setdefault((row["question"], str(row["reference"])), None)
            problems = [MathProblem(q, r, name, i) for i, (q, r) in enumerate(seen)
                        if r.strip().lstrip("-").isdigit()]
            if problems:
                return problems[:limit]
    return []


def robustness_curve(run_dir: Path, limit: int = PROBE_PROBLEMS) -> Curve:
    """Premium per form (right and every attack) of each RM export of the run; {} without exports or problems."""
    from cooper_openrlhf.rm.scorer import RMScorer

    exports, problems = rm_exports(run_dir), run_problems(run_dir, limit)
    if not exports or not problems:
        return {}
    probes, dropped = build_probes(problems)
    curve: Curve = {}
    for step, export in sorted(exports.items()):
        reading = probe_scorer(RMScorer.load(str(export), batch_size=32).score, probes, dropped)
        for form, premium in reading.premium.items():
            if form != "wrong":
                curve.setdefault(form, []).append((step, premium))
    return curve


def draw_robustness(curves: dict[str, Curve], path: Path) -> None:
    """One panel per run (label -> curve), at most 3 a row: each attack form's premium against step; right answers'
    premium black, the zero line (paid like a wrong answer) dotted."""
    per_row = min(3, max(1, len(curves)))
    rows = -(-len(curves) // per_row)
    fig, axes = plt.subplots(rows, per_row, figsize=(5.2 * per_row, 4.0 * rows + 1.2), sharey=True, squeeze=False)
    colours = dict(zip(ATTACKS, plt.get_cmap("tab10").colors))
    for ax, (label, curve) in zip(axes.flat, curves.items()):
        for form, points in curve.items():
            steps, values = zip(*points)
            style = {"color": "black", "linewidth": 2.5} if form == "right" else {"color": colours[form]}
            ax.plot(steps, values, marker="o", markersize=3, label=form, **style)
        ax.axhline(0.0, color="grey", linestyle=":", linewidth=1)
        ax.set_title(label)
        ax.set_xlabel("step (RM checkpoint)")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("premium over canonical wrong answers")
    for ax in list(axes.flat)[len(curves):]:
        ax.axis("off")
    handles = {h.get_label(): h for ax in axes.flat for h in ax.lines if not h.get_label().startswith("_")}
    # Sized to the figure's width: one narrow panel must not push the legend and the title off the image.
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 3 * per_row),
               frameon=False)
    title = ("RM robustness: what each saved RM pays the probe suite's forms above a plain wrong answer "
             "(black: right answers; an attack near it is paid like a right answer; near 0 it is refused)")
    fig.suptitle(textwrap.fill(title, width=60 * per_row))
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def write_robustness(runs: Sequence, out_dir: Path) -> Path | None:
    """rm_robustness.png for the runs (report.runs.RunData) with RM exports; None when no run has any."""
    curves = {}
    for run in runs:
        if not run.failed:
            curve = robustness_curve(Path(run.path))
            if curve:
                curves[f"{run.arm} seed {run.seed}"] = curve
    if not curves:
        return None
    path = Path(out_dir) / FIGURE
    draw_robustness(curves, path)
    return path
