"""report/stats.py on hand-made numbers; the report's statistics section; the alarm's early rule (issue 33)."""

import math

import pytest

from cooper_openrlhf.report.stats import (
    bootstrap_mean_ci,
    final_accuracy,
    lowest_before,
    newey_west_slope,
    paired_difference,
    sign_flip_p,
)


def test_final_is_the_mean_of_the_last_three_evaluations():
    assert final_accuracy([(8, 0.4), (2, 0.1), (4, 0.2), (6, 0.3)]) == pytest.approx(0.3)  # steps 4, 6, 8
    assert final_accuracy([(2, 0.5)]) == 0.5 and final_accuracy([]) is None


def test_sign_flip_p_enumerates_every_sign_pattern():
    assert sign_flip_p([1.0, 2.0]) == pytest.approx(0.5)  # |sums| 3, 1, 1, 3: two of four reach 3
    assert sign_flip_p([1.0, 1.0, 1.0]) == pytest.approx(0.25)
    assert sign_flip_p([0.1] * 8) == pytest.approx(2 / 256)  # only all-plus and all-minus reach it
    assert sign_flip_p([0.1, -0.1, 0.05, -0.05]) == pytest.approx(1.0)


def test_paired_differences_on_hand_made_seeds():
    finals = {"cooper": {s: 0.40 + 0.01 * s for s in range(8)}, "offline_pairs": {s: 0.30 + 0.01 * s for s in range(8)},
              "static": {0: 0.41, 1: 0.39, 2: 0.43, 3: 0.41, 4: 0.42, 5: 0.47, 6: 0.45, 7: 0.48}, "rule": {0: 0.4}}
    beats = paired_difference("cooper", "offline_pairs", finals)
    assert beats.differences == pytest.approx([0.1] * 8) and (beats.mean, beats.low, beats.high) == pytest.approx((0.1,) * 3)
    assert beats.p == pytest.approx(2 / 256) and not beats.within_noise and "above offline_pairs by 0.100" in beats.words()
    level = paired_difference("cooper", "static", finals)  # differences -.01 +.02 -.01 +.02 +.02 -.02 +.01 -.01
    assert level.mean == pytest.approx(0.0025) and level.low < 0 < level.high and level.within_noise
    assert "within noise" in level.words()
    assert paired_difference("cooper", "rule", finals) is None  # one shared seed: nothing to pair


def test_the_bootstrap_ci_is_seeded_and_brackets_the_mean():
    values = [0.2, 0.3, 0.25, 0.4, 0.35, 0.3, 0.28, 0.33]
    mean, low, high = bootstrap_mean_ci(values)
    assert low < mean < high and (mean, low, high) == bootstrap_mean_ci(values)
    assert high - low < max(values) - min(values)
    assert bootstrap_mean_ci([0.5]) == (0.5, 0.5, 0.5)


def test_newey_west_widens_the_error_of_an_autocorrelated_trend():
    exact = [(x, 2.0 * x) for x in range(10)]
    assert newey_west_slope(exact) == pytest.approx((2.0, 0.0))
    # a slow wave around a line: residuals that persist over steps, as an RM reward's do
    wavy = [(x, 0.01 * x + 0.05 * math.sin(x / 6)) for x in range(80)]
    slope, iid = newey_west_slope(wavy, lags=0)
    _, robust = newey_west_slope(wavy, lags=8)
    assert robust > 1.5 * iid
    with pytest.raises(ValueError, match="3 points"):
        newey_west_slope([(0, 0), (1, 1)])


def test_an_alarm_after_the_run_bottomed_out_and_recovered_is_not_early():
    from cooper_openrlhf.report.replay import alarm_outcome

    # falls from .40 to .10 by step 10, recovers to .38 by step 20; the alarm comes at step 24
    heldout = [(2, 0.40), (6, 0.25), (10, 0.10), (14, 0.30), (20, 0.38), (22, 0.38)]
    scalars = {"eval/accuracy": heldout}
    late = alarm_outcome(scalars, [24], held_at=0.3)
    assert lowest_before(heldout, 24) == pytest.approx(0.10)
    assert late.fall_done == pytest.approx(1.0) and not late.early  # judged at .10, not at .38 (which said "early")
    early = alarm_outcome(scalars, [4], held_at=0.3)
    assert early.fall_done == 0.0 and early.early


def test_the_report_states_its_statistics_and_what_is_within_noise():
    from cooper_openrlhf.report.markdown import _statistics_section
    from cooper_openrlhf.report.runs import RunData

    def run(arm, seed, values):
        return RunData(arm=arm, seed=seed, path=f"/{arm}{seed}", scalars={"eval/accuracy": list(zip((2, 4, 6), values))})

    runs = [run("rule", s, (0.4, 0.4, 0.4 + 0.01 * s)) for s in range(4)] + \
        [run("static", s, (0.4, 0.2, 0.1)) for s in range(4)] + [run("cooper", s, (0.4, 0.4, 0.41 + 0.01 * s)) for s in range(4)]
    text = "\n".join(_statistics_section(runs))
    assert "| static | 4 | 0.233 [0.233, 0.233]" in text
    assert "| static - rule | 4 | -0.172" in text and "| cooper - rule | 4 | +0.003" in text
    assert "Within noise (CI holds 0 or p >= 0.05): static vs rule, cooper vs rule" in text  # 4 seeds: p >= 2/16


def test_the_blindspot_figure_reads_each_labs_chosen_climb_and_finals(tmp_path):
    import json

    from cooper_openrlhf.report import blindspot

    labs = []
    for name, climb in (("main", 0.15), ("median", -0.05)):
        lab = tmp_path / name
        (lab / "runs").mkdir(parents=True)
        (lab / "lab.json").write_text(json.dumps({"setup": {"rm": {"pair_stage": {
            "seed": 3, "candidates": [{"seed": 2, "climb": 0.0}, {"seed": 3, "climb": climb}]}}}}))
        labs.append(lab)
    assert [blindspot.chosen_climb(lab) for lab in labs] == [0.15, -0.05]
    rows = [{"lab": "main", "climb": 0.15, "arm": "static", "finals": {0: 0.2, 1: 0.25}},
            {"lab": "main", "climb": 0.15, "arm": "cooper", "finals": {0: 0.4, 1: 0.38}},
            {"lab": "median", "climb": -0.05, "arm": "static", "finals": {0: 0.41, 1: 0.39}}]
    out = blindspot.dependence_figure(rows, tmp_path / "blindspot.png")
    assert out.stat().st_size > 1000
