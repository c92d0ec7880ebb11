"""The lab's result against the size of its starting RM's blind spot: one point per lab folder and arm.

The lab's runs from given and pair-stage blind spots say that whether Cooper holds depends on a race -- the
policy finding the starting RM's blind spot against the co-trained RM closing it -- and so on how large the blind
spot is. Its size, as one number, is the **climb on offer** (lab/pair_stage.py): what writing the starting RM's
best-paid text that is the same for every prompt (answerless, or, in probes since version 3, one constant answer)
earns a policy at the warm start's sampled accuracy over answering. Each lab folder's record (lab.json) holds its
starting RM's probe and that accuracy, and its report (summary.json) each arm's final held-out accuracy per seed;
this reads both and draws the arms' finals against the climb. The rule arm reads no RM: it is one band.

Folders are compared only if they differ in nothing but the starting RM (and which arms and seeds ran):
`incompatible_settings` names any other difference, so a sweep cannot mix two paces or tasks.
"""

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cooper_openrlhf.lab.pair_stage import climb_on_offer
from cooper_openrlhf.lab.arms import ARMS

RULE = "rule"
# Settings that say how the starting RM came about, or which runs exist: what a sweep over blind spots varies.
VARIED_SETTINGS = ("name", "arms", "seeds", "budget_minutes", "starting_rm", "rm_pair_steps", "rm_pair_lr",
                   "rm_pair_candidates", "rm_pair_candidate")


@dataclass(frozen=True)
class LabPoint:
    lab: str  # the lab folder
    arm: str
    climb: float  # the starting RM's climb on offer at the warm start's sampled train accuracy
    finals: tuple[float, ...]  # final held-out accuracy, one per seed

    @property
    def mean(self) -> float:
        return statistics.fmean(self.finals)

    @property
    def std(self) -> float:
        return statistics.stdev(self.finals) if len(self.finals) > 1 else 0.0


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {what} (run the lab, or give a folder with lab.json and summary.json)")
    return json.loads(path.read_text(encoding="utf-8"))


def read_lab(lab_dir: str | Path) -> tuple[dict, dict]:
    """A lab folder's record and report summary: `<lab>/lab.json` and `<lab>/report/summary.json`, or, for a
    committed report (docs/results/<name>/), both at its top."""
    lab_dir = Path(lab_dir)
    record = _read_json(lab_dir / "lab.json", "lab record")
    summary_path = lab_dir / "report" / "summary.json"
    return record, _read_json(summary_path if summary_path.is_file() else lab_dir / "summary.json", "report summary")


def lab_points(lab_dir: str | Path, record: dict, summary: dict) -> list[LabPoint]:
    """One point per arm of the lab (its failed runs are not in `final_values`)."""
    setup = record["setup"]
    accuracy = setup["policy"].get("train_accuracy")
    if accuracy is None:
        raise ValueError(f"{lab_dir}: lab.json has no warm-start train accuracy (setup.policy.train_accuracy); "
                         "the climb on offer is defined for the lab's warm-started policy")
    climb = climb_on_offer(setup["rm_probe"], accuracy)
    return [LabPoint(str(lab_dir), arm["arm"], climb, tuple(arm["final_values"]))
            for arm in summary["arms"] if arm.get("final_values")]


def incompatible_settings(records: Sequence[dict]) -> list[str]:
    """Settings (other than VARIED_SETTINGS) whose value is not the same in every record."""
    settings = [{k: v for k, v in r["preset_settings"].items() if k not in VARIED_SETTINGS} for r in records]
    keys = set().union(*settings) if settings else set()
    return sorted(k for k in keys if len({json.dumps(s.get(k), sort_keys=True) for s in settings}) > 1)


def sweep(lab_dirs: Sequence[str | Path]) -> list[LabPoint]:
    """Every arm of every lab folder, sorted by climb; fails naming the settings in which the folders differ."""
    read = [(d, *read_lab(d)) for d in lab_dirs]
    differ = incompatible_settings([record for _, record, _ in read])
    if differ:
        raise ValueError("the lab folders differ in more than their starting RM: " + ", ".join(differ)
                         + " (a sweep compares blind spots at one setting)")
    points = [p for d, record, summary in read for p in lab_points(d, record, summary)]
    return sorted(points, key=lambda p: (p.climb, p.arm))


def rule_band(points: Sequence[LabPoint]) -> LabPoint | None:
    """The rule arm's finals pooled over every folder (it reads no RM, so its climb means nothing)."""
    finals = tuple(v for p in points if p.arm == RULE for v in p.finals)
    return LabPoint("all", RULE, float("nan"), finals) if finals else None


def markdown_table(points: Sequence[LabPoint]) -> str:
    """Rows: starting RMs by climb; columns: the RM arms' final held-out accuracy, mean ± std (per seed)."""
    arms = list(dict.fromkeys(p.arm for p in points if p.arm != RULE))
    labs = list(dict.fromkeys(p.lab for p in points if p.arm != RULE))
    cell = {(p.lab, p.arm): p for p in points}
    lines = ["| lab (starting RM) | climb on offer | " + " | ".join(arms) + " |", "|---|---|" + "---|" * len(arms)]
    for lab in labs:
        climb = next(p.climb for p in points if p.lab == lab)
        cells = [f"{cell[lab, a].mean:.3f} ± {cell[lab, a].std:.3f} ({', '.join(f'{v:.2f}' for v in cell[lab, a].finals)})"
                 if (lab, a) in cell else "-" for a in arms]
        lines.append(f"| {lab} | {climb:+.3f} | " + " | ".join(cells) + " |")
    rule = rule_band(points)
    if rule:
        lines.append(f"\nrule arm (reads no RM), every folder's seeds pooled: {rule.mean:.3f} ± {rule.std:.3f} "
                     f"({len(rule.finals)} runs)")
    return "\n".join(lines) + "\n"


def figure(points: Sequence[LabPoint], path: Path) -> None:
    """Final held-out accuracy against the climb on offer: per arm its seeds (dots) and mean ± std (bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cooper_openrlhf.report.figures import DPI, arm_colours

    arms = list(dict.fromkeys(p.arm for p in points))
    colours = arm_colours(arms, ARMS)
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    rule = rule_band(points)
    if rule:
        ax.axhspan(rule.mean - rule.std, rule.mean + rule.std, color=colours[RULE], alpha=0.15, linewidth=0)
        ax.axhline(rule.mean, color=colours[RULE], label=f"rule (reads no RM), {len(rule.finals)} runs")
    others = [a for a in arms if a != RULE]
    width = 0.004  # arms side by side at each climb, so their bars do not hide each other
    for i, arm in enumerate(others):
        mine = [p for p in points if p.arm == arm]
        shift = (i - (len(others) - 1) / 2) * width
        xs = [p.climb + shift for p in mine]
        # Dotted: the points are separate starting RMs, joined only to be read as one arm.
        ax.errorbar(xs, [p.mean for p in mine], yerr=[p.std for p in mine], color=colours[arm], marker="o",
                    linestyle=":", capsize=3, label=f"{arm} (mean ± std over seeds)")
        for x, p in zip(xs, mine):
            ax.scatter([x] * len(p.finals), p.finals, color=colours[arm], s=10, alpha=0.45, linewidths=0)
    climbs = sorted({round(p.climb, 3) for p in points if p.arm != RULE})
    ax.set_xticks(climbs, [f"{c:+.2f}" for c in climbs])  # one tick per starting RM (blindspot.md names them)
    ax.set_xlabel("starting RM's climb on offer (what not answering earns over answering)")
    ax.set_ylabel("final held-out accuracy")
    ax.set_title("The lab against the size of the starting RM's blind spot")
    ax.set_ylim(-0.03, None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)  # below: off the points
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
