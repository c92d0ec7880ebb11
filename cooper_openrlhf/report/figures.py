"""The report's figures, drawn headless with matplotlib (Agg) into PNG files.

Every figure is written even when no run logged its metric (the panel then says which key is missing), so
a report always has the same files. One colour per arm; the line is the mean over the arm's seeds of each seed's
trailing mean over SMOOTHING steps, the band one standard error over the seeds (report/aggregate.py
`smoothed_band`; held-out evaluations are drawn unsmoothed, with markers). Each panel's title says which of the two
it is (`SMOOTHED`, `UNSMOOTHED`) and each figure's title describes every panel, so that no claim of one panel's
reads as the figure's. Legends sit outside the axes, alarms are a rug under the curves, and no figure is wider than
1600 px.
  rewards_accuracy.png  RM reward, verified accuracy (training rollouts) and held-out accuracy over steps
  rm_pair_accuracy.png  the RM's accuracy on each step's fresh pairs, before it trains on them
  hacking_gap.png       RM reward - verified accuracy on the training rollouts, with the steps the hacking
                        guard raised its alarm, and on the held-out rollouts (eval/reward_hacking_gap); and
                        what the RM paid the training rollouts the verifier marks wrong (wrong_paid_more's input)
  step_time.png         seconds per step by stage (`timing/*`, stacked), mean over seeds, one panel per arm
  exploit_rate.png      only given the lab's answer style S (the style lab): the share of each step's rollouts
                        written in S, and the share in S and verified wrong (the exploit rate, a style plan's
                        measure), from the rollout logs (report/rollouts.py `style_series`)
"""

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on training machines
import matplotlib.pyplot as plt  # noqa: E402

from cooper_openrlhf.algo.metric_keys import (  # noqa: E402
    ACCURACY,
    GAP,
    HELDOUT_GAP,
    PAIR_ACCURACY,
    RM_REWARD,
    WRONG_REWARD,
)
from cooper_openrlhf.report.aggregate import (  # noqa: E402
    alarm_steps,
    band,
    heldout_series,
    smoothed_band,
    stage_seconds,
)
from cooper_openrlhf.report.rollouts import STYLE_EXPLOIT, STYLE_SHARE  # noqa: E402
from cooper_openrlhf.report.runs import RunData  # noqa: E402

FIGURES = ("rewards_accuracy.png", "rm_pair_accuracy.png", "hacking_gap.png", "step_time.png")
STYLE_FIGURE = "exploit_rate.png"  # drawn only when the report is given the lab's answer style
DPI = 100
MAX_WIDTH_INCHES = 16  # 1600 px at DPI: readable on a laptop screen without zooming
SMOOTHING = 5  # steps of each seed's trailing mean (a training step's batch is a handful of prompts)
BAND_NOTE = "line: mean over seeds; band: \u00b11 standard error over seeds"
SMOOTHED = f"each seed's {SMOOTHING}-step trailing mean"  # a panel title's second line: how its curves are drawn
UNSMOOTHED = "each evaluation, unsmoothed"
plt.rcParams.update({"font.size": 11, "axes.titlesize": 12, "legend.fontsize": 10})


def _by_arm(runs: Sequence[RunData]) -> dict[str, list[RunData]]:
    arms: dict[str, list[RunData]] = {}
    for run in runs:
        if not run.failed:
            arms.setdefault(run.arm, []).append(run)
    return arms


# Colours a reader tells apart, one per arm in the order of the lab's arms (lab/arms.py): pairwise at least 30
# degrees of hue apart, or black and grey, or far apart in lightness (tab10's orange and brown, static and
# cooper_official, looked alike in the headline figure). A new arm needs a colour added here.
PALETTE = ["#0072b2", "#d55e00", "#009e73", "#808000", "#9467bd", "#000000", "#7f7f7f", "#cc79a7", "#2ca02c",
           "#3b3bd6", "#fb9a99", "#6b0f3a", "#ffca80"]


def fitted_limits(values: Sequence[float], floor: float = 0.0, ceiling: float = 1.0) -> tuple[float, float]:
    """Axis limits around `values` with a margin (a tenth of their span, at least 0.02), inside [floor, ceiling]: a
    panel whose data span 0.08-0.18 shows that span, not 0-1 (where a gap of 0.05 is a few pixels)."""
    if not values:
        return floor - 0.02, ceiling + 0.02
    low, high = min(values), max(values)
    pad = max(0.02, 0.1 * (high - low))
    return max(floor - 0.02, low - pad), min(ceiling + 0.02, high + pad)


def arm_colours(arms: Sequence[str], known_arms: Sequence[str] = ()) -> dict[str, str]:
    """A colour per arm: each of `known_arms` (the caller's fixed list, e.g. the lab's arms) always its own, by its
    place in that list (static is the same colour in every report, whichever arms it holds); any other arm the next
    free colour in the order the arms first appear."""
    palette = PALETTE + [c for c in (matplotlib.colors.to_hex(c) for c in plt.get_cmap("tab10").colors)
                         if c not in PALETTE]
    known = list(known_arms)[: len(palette)]
    colours = {arm: palette[known.index(arm)] for arm in arms if arm in known}
    free = [c for c in palette if c not in colours.values()] or palette
    others = [arm for arm in arms if arm not in colours]
    colours.update({arm: free[i % len(free)] for i, arm in enumerate(others)})
    return colours


def _plot_band(ax, curves, colour: str, label: str, markers: bool = False) -> bool:
    """Smoothed mean line and standard-error band of the non-empty curves; False when there are none. Sparse
    curves (markers: held-out evaluations, pair accuracy) are drawn unsmoothed."""
    curves = [c for c in curves if c]
    if not curves:
        return False
    b = smoothed_band(curves, 1 if markers else SMOOTHING)
    ax.plot(b.steps, b.mean, color=colour, label=f"{label} (n={len(curves)})", marker="o" if markers else None,
            markersize=4)
    if len(curves) > 1:
        ax.fill_between(b.steps, b.low, b.high, color=colour, alpha=0.2, linewidth=0)
    return True


def _metric_panel(ax, arms, colours, curves_of, title: str, ylabel: str, missing: str, markers=False) -> None:
    """One metric per arm; the title gets a second line saying how the curves are drawn (`_plot_band`)."""
    drawn = [_plot_band(ax, [curves_of(run) for run in runs], colours[arm], arm, markers) for arm, runs in arms.items()]
    ax.set_title(f"{title}\n({UNSMOOTHED if markers else SMOOTHED})")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if not any(drawn):
        ax.text(0.5, 0.7, f"no run logged\n{missing}", ha="center", va="center", transform=ax.transAxes, color="grey")


def _legend_below(fig, axes, extra_rows: int = 0) -> None:
    """One legend for the figure, under its panels (never over the data): the arms, and any rug's entry."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    rows = -(-len(seen) // 4) if seen else 0
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=min(4, len(seen)), frameon=False)
    fig.tight_layout(rect=(0, 0.05 * (rows + extra_rows) + (0.02 if rows else 0), 1, 1))


def _alarm_rug(ax, arms, colours) -> None:
    """The steps at which each run's hacking alarm was on, as ticks under the curves (one row per arm)."""
    labelled = False
    for row, (arm, runs) in enumerate(arms.items()):
        steps = sorted({s for run in runs for s in alarm_steps(run.scalars)})
        if steps:
            ax.plot(steps, [0.02 + 0.035 * row] * len(steps), "|", color=colours[arm], markersize=9,
                    transform=ax.get_xaxis_transform(), label=None if labelled else "hacking alarm on (rug, per arm)")
            labelled = True


def _integer_steps(ax) -> None:
    ax.xaxis.get_major_locator().set_params(integer=True)


def rewards_accuracy(arms, colours, path: Path) -> tuple[float, float]:
    """The headline figure; returns the held-out panel's y limits (fitted to its data)."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    _metric_panel(axes[0], arms, colours, lambda r: r.scalars.get(RM_REWARD, []), "RM reward (training rollouts)",
                  "mean reward / accuracy", RM_REWARD)
    _metric_panel(axes[1], arms, colours, lambda r: r.scalars.get(ACCURACY, []),
                  "Verified accuracy (training rollouts)", "", ACCURACY)
    _metric_panel(axes[2], arms, colours, lambda r: heldout_series(r.scalars), "Held-out accuracy (other prompts)",
                  "", "eval/accuracy or eval/<name>/accuracy", markers=True)
    for ax in axes:
        _integer_steps(ax)
    for ax in axes[:2]:
        ax.set_ylim(-0.02, 1.02)  # the RM reward and the verified accuracy share [0, 1]: they compare at a glance
    # Held-out accuracy on its own axis, fitted to the drawn curves and bands: its arms differ by a few points.
    drawn = [y for artist in axes[2].lines for y in artist.get_ydata()]
    drawn += [y for band in axes[2].collections for path in band.get_paths() for y in path.vertices[:, 1]]
    axes[2].set_ylim(*fitted_limits(drawn))
    fig.suptitle("The training rollouts as the RM pays them and as the rule verifier grades them, and held-out "
                 f"accuracy\n({BAND_NOTE})")
    _legend_below(fig, axes)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return axes[2].get_ylim()


def rm_pair_accuracy(arms, colours, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.8))
    _metric_panel(ax, arms, colours, lambda r: r.scalars.get(PAIR_ACCURACY, []),
                  "RM pair accuracy on each step's fresh pairs (before its update)", "pair accuracy", PAIR_ACCURACY)
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=1)
    ax.set_ylim(-0.02, 1.02)
    ax.annotate("chance", xy=(1.0, 0.5), xycoords=("axes fraction", "data"), xytext=(-4, 3),
                textcoords="offset points", ha="right", color="grey", fontsize="small")
    _integer_steps(ax)
    fig.suptitle(BAND_NOTE, fontsize="small")  # the panel's title says the rest
    _legend_below(fig, [ax])
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def hacking_gap(arms, colours, path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(MAX_WIDTH_INCHES, 4.8), sharey=True)
    ax, held_out, wrong_paid = axes
    _metric_panel(ax, arms, colours, lambda r: r.scalars.get(GAP, []),
                  "Gap: RM reward - verified accuracy", "gap", GAP)
    _alarm_rug(ax, arms, colours)
    # The same gap on the held-out prompts: the same questions at every evaluation, so far less noisy (rule heldout_gap_grows).
    _metric_panel(held_out, arms, colours, lambda r: r.scalars.get(HELDOUT_GAP, []),
                  "The same gap on held-out rollouts", "", HELDOUT_GAP, markers=True)
    # Hacking itself: the RM paying what the verifier rejects. Cooper's RM learns such episodes away (rule wrong_paid_more).
    _metric_panel(wrong_paid, arms, colours, lambda r: r.scalars.get(WRONG_REWARD, []),
                  "RM reward on verified-wrong rollouts", "", WRONG_REWARD)
    for panel in axes:
        panel.axhline(0.0, color="grey", linewidth=1)
        panel.tick_params(labelleft=True)
        _integer_steps(panel)
    fig.suptitle("What the RM pays beyond the verifier: on the training rollouts, on the held-out ones, and on the "
                 f"training rollouts the verifier marks wrong\n({BAND_NOTE})")
    _legend_below(fig, axes)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def exploit_rate(arms, colours, path: Path, style: str) -> None:
    """The style lab's exploit, step by step: how much the policy writes S, and how much of that the verifier rejects
    (the hedge's wrong answers, which a blind RM pays)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    _metric_panel(axes[0], arms, colours, lambda r: r.scalars.get(STYLE_SHARE, []),
                  "Rollouts written in S", "share of the step's rollouts", f"{STYLE_SHARE} (no rollout log)")
    _metric_panel(axes[1], arms, colours, lambda r: r.scalars.get(STYLE_EXPLOIT, []),
                  "Rollouts in S and verified wrong (exploit rate)", "", f"{STYLE_EXPLOIT} (no rollout log)")
    drawn = [y for ax in axes for artist in ax.lines for y in artist.get_ydata()]
    for ax in axes:
        ax.set_ylim(*fitted_limits(drawn))  # one axis for both: the exploit is a part of the share
        _integer_steps(ax)
    fig.suptitle(f"How often the policy writes the answer style S = {style!r}, and wrongly\n({BAND_NOTE})")
    _legend_below(fig, axes)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def step_time(arms, colours, path: Path) -> None:
    """Stacked seconds per stage, one panel per arm (at most 3 a row). Step 1 carries the start-up (model loads,
    compilation): it is drawn but left out of the y scale, so the later steps' stages stay visible."""
    per_row = min(3, max(1, len(arms)))
    rows = max(1, -(-len(arms) // per_row))
    fig, axes = plt.subplots(rows, per_row, figsize=(min(MAX_WIDTH_INCHES, 5.2 * per_row), 4.2 * rows + 0.8),
                             sharey=True, squeeze=False)
    stages_seen: dict[str, object] = {}
    # Set2 then Dark2: saturated enough to read on white, hues apart from the arms' tab10 (used in the titles).
    cmap = plt.get_cmap("Set2").colors + plt.get_cmap("Dark2").colors
    highest_after_start = 0.0
    first_steps = []  # (axes, step 1, its total): named on the plot once the shared scale shows it is cut off
    for ax, (arm, runs) in zip(axes.flat, arms.items()):
        per_stage: dict[str, list] = {}
        for run in runs:
            for stage, points in stage_seconds(run.scalars).items():
                per_stage.setdefault(stage, []).append(points)
        bottom: dict[int, float] = {}
        steps = sorted({s for curves in per_stage.values() for c in curves for s, _ in c})
        width = 0.8 * min((b - a for a, b in zip(steps, steps[1:])), default=1)  # logging every k steps: wider bars
        for stage, curves in per_stage.items():
            b = band(curves)
            colour = stages_seen.setdefault(stage, cmap[len(stages_seen) % len(cmap)])
            ax.bar(b.steps, b.mean, bottom=[bottom.get(s, 0.0) for s in b.steps], color=colour, width=width,
                   edgecolor="white", linewidth=0.3 if len(steps) <= 60 else 0)
            for step, value in zip(b.steps, b.mean):
                bottom[step] = bottom.get(step, 0.0) + value
        later = [total for step, total in bottom.items() if step != min(bottom, default=0)]
        highest_after_start = max([highest_after_start, *later])
        if steps and later:
            first_steps.append((ax, steps[0], bottom[steps[0]]))
        ax.set_title(f"{arm} (n={len(runs)})", color=colours[arm])
        ax.set_xlabel("step")
        ax.grid(alpha=0.3, axis="y")
        _integer_steps(ax)
        if not per_stage:
            ax.text(0.5, 0.5, "no run logged\ntiming/*", ha="center", va="center", transform=ax.transAxes, color="grey")
    for ax in list(axes.flat)[len(arms):]:
        ax.set_visible(False)
    if not arms:
        axes[0][0].set_visible(True)
        axes[0][0].text(0.5, 0.5, "no run to show", ha="center", va="center", transform=axes[0][0].transAxes)
    if highest_after_start > 0:
        axes[0][0].set_ylim(0, 1.1 * highest_after_start)
        for ax, step, total in first_steps:
            if total > 1.1 * highest_after_start:
                ax.annotate(f"step {step}: {total:.0f} s\n(start-up, off scale)", xy=(step, 1.0),
                            xycoords=("data", "axes fraction"), xytext=(4, -4), textcoords="offset points",
                            va="top", fontsize="small", color="dimgrey")
    for row in axes:
        row[0].set_ylabel("seconds per step (mean over seeds)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in stages_seen.values()]
    if handles:
        fig.legend(handles, list(stages_seen), title="stage (timing/*), bottom to top", loc="lower center",
                   ncol=min(len(handles), 5), fontsize="small", frameon=False)
    fig.suptitle("Step time by stage, stacked, one panel per arm (mean over seeds, unsmoothed)")
    legend_rows = -(-len(handles) // 5) if handles else 0
    fig.tight_layout(rect=(0, (0.06 + 0.05 * legend_rows) / rows, 1, 1))  # room for the legend underneath
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def write_style_figure(runs: Sequence[RunData], path: Path, style: str, known_arms: Sequence[str] = ()) -> Path:
    """STYLE_FIGURE alone, of runs loaded with `style` (report/runs.py `load_run`): a style plan's verdict draws its
    primary measure with it."""
    arms = _by_arm(runs)
    path.parent.mkdir(parents=True, exist_ok=True)
    exploit_rate(arms, arm_colours(list(arms), known_arms), path, style)
    return path


def write_figures(runs: Sequence[RunData], out_dir: Path, known_arms: Sequence[str] = (),
                  style: str | None = None) -> list[Path]:
    """Draw every figure of the report (module docstring) into out_dir; returns their paths. known_arms: arms whose
    colour is fixed (`arm_colours`); style: the lab's answer sentence S, which adds STYLE_FIGURE."""
    out_dir.mkdir(parents=True, exist_ok=True)
    arms = _by_arm(runs)
    colours = arm_colours(list(arms), known_arms)
    paths = [out_dir / name for name in FIGURES]
    for draw, path in zip((rewards_accuracy, rm_pair_accuracy, hacking_gap, step_time), paths):
        draw(arms, colours, path)
    if style is not None:
        paths.append(out_dir / STYLE_FIGURE)
        exploit_rate(arms, colours, paths[-1], style)
    return paths
