"""The report's RM health figure: what each arm's RM pays the guard's anchors, step by step.

  rm_health.png  drawn when some run logged `cooper/rm_health/*` (core/rm_health.py; every RM-training arm with
                 anchors, guarded or in --cooper.rm_guard watch): the AUC of right against wrong anchors, the mean
                 pay of right (solid) and wrong (dashed) anchors, each of the version that scores the next step;
                 under the curves a rug of the steps whose update the guard found out of bounds (rolled back, or
                 kept under watch). One colour per arm, as the report's other figures; the same smoothing.
A collapse (the probe lab's Cooper arms: RMs ending with right and wrong paid alike) shows as the AUC falling towards
0.5 and the two pay lines meeting; a guarded arm's lines stay apart, its rug shows what the guard caught.
"""

from collections.abc import Sequence
from pathlib import Path

from cooper_openrlhf.core.rm_health import HEALTH
from cooper_openrlhf.report.figures import (BAND_NOTE, DPI, SMOOTHED, _by_arm, _integer_steps, _legend_below,
                                            _metric_panel, _plot_band, arm_colours, plt)
from cooper_openrlhf.report.runs import RunData

FIGURE = "rm_health.png"
AUC, RIGHT, WRONG, UNHEALTHY = (HEALTH + name for name in ("auc", "right_pay", "wrong_pay", "unhealthy"))


def write_rm_health(runs: Sequence[RunData], out_dir: Path, known_arms: Sequence[str] = ()) -> Path | None:
    """Draw FIGURE into out_dir (module docstring); None when no run logged RM health."""
    arms = {arm: [run for run in members if AUC in run.scalars] for arm, members in _by_arm(runs).items()}
    arms = {arm: members for arm, members in arms.items() if members}
    if not arms:
        return None
    colours = arm_colours(list(_by_arm(runs)), known_arms)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    _metric_panel(axes[0], arms, colours, lambda run: run.scalars.get(AUC, []), "Anchor AUC, right vs wrong",
                  "AUC", AUC)
    axes[0].axhline(0.5, color="grey", linewidth=1, linestyle=":")
    for arm, members in arms.items():
        _plot_band(axes[1], [run.scalars.get(RIGHT, []) for run in members], colours[arm], arm)
        _plot_band(axes[1], [run.scalars.get(WRONG, []) for run in members], colours[arm], arm)
        axes[1].lines[-1].set_linestyle("--")
        axes[1].lines[-1].set_label(None)
    axes[1].set_title(f"Mean pay of right (solid) and wrong (dashed) anchors\n({SMOOTHED})")
    axes[1].set_xlabel("step")
    axes[1].grid(alpha=0.3)
    for row, (arm, members) in enumerate(arms.items()):
        steps = sorted({step for run in members for step, value in run.scalars.get(UNHEALTHY, []) if value > 0})
        if steps:
            axes[0].plot(steps, [0.02 + 0.035 * row] * len(steps), "|", color=colours[arm], markersize=9,
                         transform=axes[0].get_xaxis_transform(), label="update out of bounds (rug, per arm)")
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
        _integer_steps(ax)
    fig.suptitle(f"RM health on the guard's anchors: how well it ranks them, and what it pays each kind ({BAND_NOTE})")
    _legend_below(fig, axes)
    path = out_dir / FIGURE
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
