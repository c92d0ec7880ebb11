"""The report's measures on hand-made numbers: seed statistics and the paired comparison of arms, an alarm's
timing, the blindspot figure's reading, the rollouts' pair accuracy and the style lab's exploit rate."""

import json
import math

import pytest

from cooper_openrlhf.report.runs import load_run
from run_folders import write_events as _write_events
from run_folders import write_rollouts as _rollouts


def test_seed_statistics_on_hand_made_numbers():
    from cooper_openrlhf.report.seed_stats import (
        bootstrap_mean_interval,
        final_value,
        newey_west_slope_se,
        paired_comparison,
        sign_flip_p_value,
    )

    assert final_value([(1, 0.9), (2, 0.1), (3, 0.2), (4, 0.3)]) == pytest.approx(0.2)
    assert final_value([(1, 0.5)]) == 0.5
    low, high = bootstrap_mean_interval([0.1, 0.2, 0.3, 0.4, 0.5])
    assert 0.1 < low < 0.3 < high < 0.5
    # Sign flips of (0.1, 0.1, 0.1): only all-plus and all-minus reach |mean| 0.1, so p = 2 / 8.
    assert sign_flip_p_value([0.1, 0.1, 0.1]) == pytest.approx(0.25)
    cooper, rule, static = {0: 0.40, 1: 0.38, 2: 0.42, 3: 0.39}, {0: 0.41, 1: 0.37, 2: 0.40, 3: 0.40}, \
        {0: 0.10, 1: 0.20, 2: 0.05, 3: 0.15, 7: 0.3}
    near = paired_comparison(cooper, rule)
    assert near.seeds == 4 and near.mean_difference == pytest.approx(0.0025) and near.within_noise
    far = paired_comparison(cooper, static)  # seed 7 has no cooper run: left out
    assert far.seeds == 4 and far.mean_difference == pytest.approx(0.2725) and far.interval[0] > 0
    assert far.p_value == pytest.approx(2 / 16)  # every difference positive: the most extreme of 16 patterns
    # The plans' meaning of within noise, the only one: an interval off 0 is not enough; with 4 seeds the smallest
    # sign-flip p is 2/16 = 0.125, so no 4-seed difference is apart.
    assert far.within_noise
    eight = paired_comparison({s: 0.4 for s in range(8)}, {s: 0.1 + 0.01 * s for s in range(8)})
    assert eight.p_value == pytest.approx(2 / 256) and not eight.within_noise
    assert paired_comparison({0: 0.1}, {0: 0.2}) is None
    # A wandering (autocorrelated) curve: Newey-West's error exceeds the plain one, which treats steps as independent.
    walk = [(t, 0.3 + 0.01 * t + 0.1 * math.sin(t / 3)) for t in range(30)]  # a slow swing about a trend
    xs = [x for x, _ in walk]
    mean_x = sum(xs) / len(xs)
    slope = sum((x - mean_x) * y for x, y in walk) / sum((x - mean_x) ** 2 for x in xs)
    mean_y = sum(y for _, y in walk) / len(walk)
    residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in walk) / (len(walk) - 2)
    plain = (residual / sum((x - mean_x) ** 2 for x in xs)) ** 0.5
    assert newey_west_slope_se(walk) > plain


def test_an_alarm_after_the_run_bottomed_out_and_recovered_is_not_early():
    """Judged at the lowest evaluation before the alarm, not the latest: a run that fell to .05 and climbed back to
    .35 before its alarm had its whole fall behind it."""
    from cooper_openrlhf.report.replay import alarm_outcome

    recovered = {"eval/accuracy": [(2, 0.40), (10, 0.05), (20, 0.35), (30, 0.30)]}
    late = alarm_outcome(recovered, [25], held_at=0.25)
    assert late.fall_done == pytest.approx(1.0) and not late.early


def test_the_report_compares_arms_seed_by_seed_and_says_what_is_within_noise(tmp_path):
    from cooper_openrlhf.cli.report import main

    # 6 seeds: an all-one-sign difference has p = 2/64 < 0.05; with 3, no difference could be apart (p >= 2/8).
    finals = {"rule": (0.40, 0.42, 0.38, 0.40, 0.42, 0.38), "cooper": (0.41, 0.41, 0.39, 0.41, 0.41, 0.39),
              "static": (0.10, 0.20, 0.05, 0.10, 0.20, 0.05)}
    for arm, values in finals.items():
        for seed, value in enumerate(values):
            _write_events(tmp_path / f"{arm}_seed{seed}" / "tb" / "ppo_run", {"eval/accuracy": [(2, 0.4), (20, value)]})
    assert main([*(str(p) for p in sorted(tmp_path.glob("*_seed*"))), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Paired differences (held-out, final)" in text
    assert "| cooper | rule | 6 | +0.002 |" in text  # finals are the mean of (0.4, value) here: halves the gaps
    assert "Within noise: cooper vs rule (+0.002). Apart: static vs rule (-0.142); cooper vs static" in text


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


def test_rollout_pair_accuracy_ranks_each_groups_right_rollouts_against_its_wrong_ones():
    from cooper_openrlhf.report.negatives import rollout_pair_accuracy, window_means

    rows = [{"step": 1, "question": "q1", "verified": True, "reward": 0.9},
            {"step": 1, "question": "q1", "verified": False, "reward": 0.2},
            {"step": 1, "question": "q1", "verified": False, "reward": 0.9},  # a tie: half
            {"step": 1, "question": "q2", "verified": False, "reward": 0.95},  # no right rollout: no pair
            {"step": 2, "question": "q1", "verified": True, "reward": 0.3},
            {"step": 2, "question": "q1", "verified": False, "reward": 0.6},
            {"step": 2, "question": "q1", "verified": False, "reward": None}]  # unscored: left out
    assert rollout_pair_accuracy(rows) == {1: (0.75, 2), 2: (0.0, 1)}
    assert window_means({1: 0.5, 2: 1.0, 5: 0.0}, [(1, 2), (3, 4), (5, 9)]) == [0.75, None, 0.0]


def test_given_the_labs_style_the_report_draws_each_steps_exploit_rate_the_plans_measure_step_by_step(tmp_path):
    from cooper_openrlhf.cli.report import main
    from cooper_openrlhf.report.registered_measures import TRAINING_WINDOW, exploit_rate
    from cooper_openrlhf.report.rollouts import STYLE_EXPLOIT, STYLE_SHARE

    hedge = "The answer is {other}. The answer is {answer}."

    def row(step, completion, verified):
        return {"step": step, "question": "q", "reference": "4", "completion": completion, "verified": verified,
                "reward": 0.9}

    # Step s: s - 1 of its 4 rollouts hedge (the first right, reference last; the others wrong); the rest plain.
    styled = ["The answer is 3. The answer is 4.", "The answer is 4. The answer is 3.", "The answer is 4. The answer is 9."]
    rows = [row(s, styled[i] if i < s - 1 else "The answer is 4.", i in (0, s - 1) if i < s - 1 else True)
            for s in (1, 2, 3, 4) for i in range(4)]
    run = tmp_path / "static_seed0"
    _write_events(run / "tb", {"train/cooper/verified_accuracy": [(s, 0.5) for s in (1, 2, 3, 4)]})
    _rollouts(run / "samples", rows)

    loaded = load_run(run, style=hedge)
    assert loaded.scalars[STYLE_SHARE] == [(1, 0.0), (2, 0.25), (3, 0.5), (4, 0.75)]
    assert loaded.scalars[STYLE_EXPLOIT] == [(1, 0.0), (2, 0.0), (3, 0.25), (4, 0.5)]
    assert STYLE_SHARE not in load_run(run).scalars  # no style, no series: the other presets' reports are unchanged
    # The figure's points, averaged over the plan's window of equal-sized steps, are the plan's measure.
    assert TRAINING_WINDOW >= 4
    assert exploit_rate(run / "samples" / "rollouts.jsonl", hedge) == pytest.approx(sum(
        v for _, v in loaded.scalars[STYLE_EXPLOIT]) / 4)

    assert main([str(run), "--out", str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "exploit_rate.png").exists()
    assert main([str(run), "--out", str(tmp_path / "styled"), "--style", hedge]) == 0
    assert (tmp_path / "styled" / "exploit_rate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![exploit_rate](exploit_rate.png)" in (tmp_path / "styled" / "report.md").read_text()
    with pytest.raises(SystemExit):
        main([str(run), "--out", str(tmp_path / "bad"), "--style", "The answer is N."])


def test_style_forms_count_hedge_pairs_exploit_form_negatives_and_the_policys_own_exploit_form_wrong_answers():
    from cooper_openrlhf.report.negatives import style_forms

    hedge = "The answer is {other}. The answer is {answer}."
    pairs = [{"step": 1, "reference": "12", "positive": "The answer is 13. The answer is 12.",
              "negative": "The answer is 12. The answer is 13.", "valid": True},   # the swap: the exploit's form
             {"step": 1, "reference": "12", "positive": "The answer is 13. The answer is 12.",
              "negative": "The answer is 20. The answer is 14.", "valid": True},   # a hedge, no reference
             {"step": 1, "reference": "12", "positive": "The answer is 12.", "negative": "The answer is 9.", "valid": True},
             {"step": 1, "reference": "12", "positive": "", "negative": "", "valid": False}]
    rollouts = [{"step": 1, "reference": "12", "completion": "The answer is 12. The answer is 7.", "verified": False},
                {"step": 1, "reference": "12", "completion": "The answer is 7.", "verified": False},
                {"step": 2, "reference": "12", "completion": "The answer is 12.", "verified": True}]
    assert style_forms(pairs, rollouts, hedge) == {
        1: {"pairs": 3, "positive in S": 2, "negative in S": 2, "negative exploit form": 1, "wrong rollouts": 2,
            "wrong rollouts exploit form": 1}}  # step 2: a right rollout and no pair, nothing to count
