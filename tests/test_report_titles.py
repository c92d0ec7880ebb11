"""Each report figure's titles describe its panels as they are drawn: a panel drawn from each seed's trailing mean says
so in its own title, a panel of unsmoothed evaluations says that, and no figure title claims either for every panel
(rewards_accuracy.png's title once said "5-step trailing mean" over a held-out panel drawn unsmoothed)."""

from pathlib import Path

import matplotlib.figure
import pytest

from run_folders import write_events

STEPS = range(1, 13)
EVALS = (4, 8, 12)


def _run(folder: Path, seed: int, rm: bool) -> None:
    scalars = {"train/cooper/verified_accuracy": [(s, 0.3 + 0.01 * s + 0.01 * seed) for s in STEPS],
               "eval/accuracy": [(s, 0.1 + 0.005 * s) for s in EVALS],
               "train/timing/generation": [(s, 2.0) for s in STEPS]}
    if rm:
        scalars.update({"train/cooper/rm_reward_mean": [(s, 0.5 + 0.01 * s) for s in STEPS],
                        "train/cooper/reward_hacking_gap": [(s, 0.2) for s in STEPS],
                        "train/cooper/rm_reward_wrong_mean": [(s, 0.3) for s in STEPS],
                        "train/cooper/rm_pair_accuracy": [(s, 0.7) for s in STEPS],
                        "eval/reward_hacking_gap": [(s, 0.1) for s in EVALS],
                        "train/cooper/rm_health/auc": [(s, 0.9) for s in STEPS],
                        "train/cooper/rm_health/right_pay": [(s, 0.8) for s in STEPS],
                        "train/cooper/rm_health/wrong_pay": [(s, 0.2) for s in STEPS]})
    write_events(folder / "tensorboard", scalars)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """{figure file name: (figure title, [(panel title, drawn with markers)])} of a report over two arms x two seeds,
    read off each figure as it is saved."""
    from cooper_openrlhf.report.build import write_report

    root = tmp_path_factory.mktemp("titles")
    for arm in ("cooper", "rule"):
        for seed in (0, 1):
            _run(root / f"{arm}_seed{seed}", seed, rm=arm == "cooper")
    seen = {}
    save = matplotlib.figure.Figure.savefig

    def recording(fig, path, *args, **kwargs):
        panels = [(ax.get_title(), any(line.get_marker() not in (None, "None", "", "|") for line in ax.lines))
                  for ax in fig.axes if ax.get_visible() and ax.lines]
        seen[Path(path).name] = (fig._suptitle.get_text() if fig._suptitle else "", panels)
        return save(fig, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matplotlib.figure.Figure, "savefig", recording)
        write_report([str(root / name) for name in sorted(p.name for p in root.iterdir())], root / "out",
                     style="The answer is {answer}.")
    return seen


def test_every_curve_panel_says_how_it_is_drawn_and_no_figure_title_claims_it_for_all(drawn):
    assert {"rewards_accuracy.png", "hacking_gap.png", "rm_pair_accuracy.png", "rm_health.png"} <= set(drawn)
    for name, (title, panels) in drawn.items():
        assert "trailing mean" not in title and "unsmoothed" not in title.replace("mean over seeds, unsmoothed", ""), \
            f"{name}: the figure's title {title!r} speaks for every panel"
        for panel, markers in panels:
            if name == "step_time.png":
                continue  # bars per arm: the figure's title says they are unsmoothed means
            expected = "each evaluation, unsmoothed" if markers else "trailing mean"
            assert expected in panel, f"{name}: panel {panel!r} drawn {'with' if markers else 'without'} markers"


def test_the_headline_figures_title_names_its_held_out_panel(drawn):
    title, panels = drawn["rewards_accuracy.png"]
    assert "held-out" in title.lower()
    (heldout,) = [panel for panel, markers in panels if markers]
    assert heldout.startswith("Held-out accuracy") and "unsmoothed" in heldout
    title, _ = drawn["hacking_gap.png"]
    assert "held-out" in title.lower() and "wrong" in title
