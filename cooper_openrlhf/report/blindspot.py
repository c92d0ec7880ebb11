"""Blind-spot dependence across labs (does the comparison hold only at the blindest starting RM?): final held-out
accuracy of static and Cooper against the starting RM's climb on offer, one lab per starting-RM candidate
(`cli.lab --rm-choice blindest|between|median`).

`dependence_points` reads each lab folder's lab.json (the chosen candidate's climb, `lab/pair_stage.py`) and its
finished runs (final = `report.seed_stats.final_value`); `dependence_figure` plots them, one colour per arm, each
lab's seeds as dots and their mean with its 95% bootstrap CI.
"""

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from cooper_openrlhf.report.seed_stats import bootstrap_mean_interval

DEPENDENCE_ARMS = ("static", "cooper")


def chosen_climb(lab: Path) -> float | None:
    """The climb on offer of the candidate a lab's RM arms started from (lab.json), or None without a pair stage."""
    stage = json.loads((lab / "lab.json").read_text(encoding="utf-8"))["setup"]["rm"].get("pair_stage")
    if not stage:
        return None
    return next(c["climb"] for c in stage["candidates"] if c["seed"] == stage["seed"])


def dependence_points(labs: Sequence[Path], arms: Sequence[str] = DEPENDENCE_ARMS) -> list[dict]:
    """One row per (lab, arm): {"lab", "climb", "arm", "finals": {seed: final}}."""
    from cooper_openrlhf.report.registered_measures import lab_finals

    rows = []
    for lab in labs:
        climb = chosen_climb(lab)
        finals = lab_finals(lab)
        rows += [{"lab": lab.name, "climb": climb, "arm": arm, "finals": finals[arm]} for arm in arms
                 if finals.get(arm) and climb is not None]
    return rows


def dependence_figure(rows: Sequence[dict], path: Path, known_arms: Sequence[str] = ()) -> Path:
    """known_arms: the caller's fixed arm list, so each arm has the colour it has in the lab's report figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cooper_openrlhf.report.figures import arm_colours

    colours = arm_colours(list(dict.fromkeys(row["arm"] for row in rows)), known_arms)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for arm, colour in colours.items():
        mine = sorted((row for row in rows if row["arm"] == arm), key=lambda row: row["climb"])
        for row in mine:
            ax.scatter([row["climb"]] * len(row["finals"]), list(row["finals"].values()), color=colour, alpha=0.35, s=14)
        stats = [(row["climb"], statistics.fmean(row["finals"].values()),
                  *bootstrap_mean_interval(list(row["finals"].values()))) for row in mine]
        ax.errorbar([s[0] for s in stats], [s[1] for s in stats], yerr=[[s[1] - s[2] for s in stats],
                    [s[3] - s[1] for s in stats]], color=colour, marker="o", capsize=3, label=arm)
    for lab, climb in {row["lab"]: row["climb"] for row in rows}.items():  # which lab each column is
        ax.annotate(lab, (climb, 1.0), xycoords=("data", "axes fraction"), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=9, color="0.35")
    ax.set_xlabel("starting RM's climb on offer (pair-stage candidate)")
    ax.set_ylabel("final held-out accuracy (mean of last 3)")
    ax.set_title("Blind-spot dependence: seeds (dots), mean and 95% CI", pad=18)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(colours), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
