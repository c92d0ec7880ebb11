"""The run report (cooper_openrlhf/report/, cli/report.py) on event files written here with OpenRLHF's own writer
(torch's SummaryWriter, `train/` and `eval/` tags as its TensorboardLogger writes them): identity, reading and
merging, hand-worked aggregation, and the CLI over several arms and seeds with a failed run."""

import json
import math
from pathlib import Path

import pytest

from cooper_openrlhf.ray.run_logs import merge_points, metric_name, read_scalars
from cooper_openrlhf.report.aggregate import (
    HELDOUT_LABEL,
    VERIFIED_LABEL,
    alarm_steps,
    band,
    hacking_signature,
    heldout_series,
    stage_seconds,
    summarize_arm,
)
from cooper_openrlhf.report.runs import load_run, read_rollout_log, run_identity
from run_folders import write_events as _write_events
from run_folders import write_rollouts as _rollouts



# ------------------------------------------------------------------------------------------------ reading
def test_run_identity_from_run_info_then_folder_name_then_plain_name(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "run_info.json").write_text(json.dumps({"arm": "cooper", "seed": 3}))
    assert run_identity(tmp_path / "x") == ("cooper", 3)
    assert run_identity(tmp_path / "static_rm_seed12") == ("static_rm", 12)
    assert run_identity(tmp_path / "rule") == ("rule", 0)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run_info.json").write_text('{"seed": 1}')
    with pytest.raises(ValueError, match=r"bad/run_info.json: expected"):
        run_identity(tmp_path / "bad")


def test_metric_names_drop_openrlhfs_train_prefix_and_the_newest_write_of_a_step_wins():
    assert metric_name("train/cooper/rm_reward_mean") == "cooper/rm_reward_mean"
    assert metric_name("eval/gsm8k/accuracy") == "eval/gsm8k/accuracy"
    assert merge_points([(1.0, 2, 0.5), (2.0, 1, 0.1), (3.0, 2, 0.7), (0.5, 3, 0.2)]) == [(1, 0.1), (2, 0.7), (3, 0.2)]


def test_read_scalars_merges_a_resumed_runs_two_logger_folders(tmp_path):
    run = tmp_path / "cooper_seed0"
    _write_events(run / "tb" / "ppo_1123T01:00", {"train/cooper/verified_accuracy": [(1, 0.25), (2, 0.5), (3, 0.0)]})
    _write_events(run / "tb" / "ppo_1123T02:00", {"train/cooper/verified_accuracy": [(3, 0.75), (4, 1.0)],
                                                  "eval/accuracy": [(4, 0.5)]})
    scalars = read_scalars(run)
    assert scalars == {"cooper/verified_accuracy": [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)],
                       "eval/accuracy": [(4, 0.5)]}


def test_a_folder_without_event_files_is_a_failed_run_with_its_identity(tmp_path):
    (tmp_path / "static_seed2").mkdir()
    run = load_run(tmp_path / "static_seed2")
    assert run.failed and "no tensorboard event files" in run.error and (run.arm, run.seed) == ("static", 2)
    assert load_run(tmp_path / "missing").error == "not a folder"


def test_rollout_log_counts_and_keeps_the_last_steps_rows(tmp_path):
    rows = [{"step": 1, "verified": True, "reward": 0.9}, {"step": 1, "verified": False, "reward": 0.7},
            {"step": 2, "verified": False, "reward": 0.2}, {"step": 2, "verified": False, "reward": 0.6}]
    _rollouts(tmp_path / "samples", rows)
    (tmp_path / "samples" / "pairs.jsonl").write_text('{"valid": true}\n{"valid": false}\n')
    log = read_rollout_log(tmp_path)
    assert (log.steps, log.rollouts, log.verified, log.rewarded_unverified) == (2, 4, 1, 2)
    assert log.last_step == 2 and log.last_step_rows == rows[2:]
    assert (log.pairs, log.valid_pairs) == (2, 1)
    (tmp_path / "samples" / "rollouts.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match=r"rollouts.jsonl, line 1: not a rollout row"):
        read_rollout_log(tmp_path)


# -------------------------------------------------------------------------------------------- aggregation
def test_band_is_mean_and_min_max_over_the_seeds_that_logged_each_step():
    b = band([[(1, 0.2), (2, 0.4)], [(1, 0.4), (2, 0.8), (3, 1.0)]])
    assert b.steps == [1, 2, 3] and b.seeds == [2, 2, 1]
    assert b.mean == pytest.approx([0.3, 0.6, 1.0])
    assert (b.low, b.high) == ([0.2, 0.4, 1.0], [0.4, 0.8, 1.0])


def test_heldout_series_prefers_the_overall_key_else_averages_the_benchmarks():
    assert heldout_series({"eval/accuracy": [(2, 0.5)], "eval/a/accuracy": [(2, 0.1)]}) == [(2, 0.5)]
    per_name = {"eval/a/accuracy": [(2, 0.2), (4, 0.4)], "eval/b/accuracy": [(2, 0.6)], "eval/eval_a_pass1": [(2, 1.0)]}
    assert heldout_series(per_name) == [(2, pytest.approx(0.4)), (4, 0.4)]


def test_summarize_arm_final_and_best_mean_and_sample_std_over_seeds():
    seeds = [{"eval/accuracy": [(5, 0.30), (10, 0.50), (15, 0.40)]},
             {"eval/accuracy": [(5, 0.20), (10, 0.60), (15, 0.60)]}]
    s = summarize_arm("cooper", seeds)
    assert s.metric == HELDOUT_LABEL and s.seeds == 2
    # Final: the mean of the last 3 evaluations (0.3, 0.5, 0.4 -> 0.4; 0.2, 0.6, 0.6 -> 0.4667).
    assert s.final_values == pytest.approx([0.40, 0.46667], abs=1e-4) and s.best_values == [0.50, 0.60]
    assert s.final_mean == pytest.approx(0.43333, abs=1e-4) and s.final_std == pytest.approx(0.04714, abs=1e-4)
    assert s.final_interval == pytest.approx((0.40, 0.46667), abs=1e-4)  # two seeds: the bootstrap's extremes
    assert s.best_mean == pytest.approx(0.55) and s.best_std == pytest.approx(math.sqrt(0.005))
    # A seed without held-out evaluation: the whole arm falls back to verified accuracy, labelled.
    mixed = summarize_arm("rule", [{**seeds[0], "cooper/verified_accuracy": [(1, 0.1), (2, 0.3)]},
                                   {"cooper/verified_accuracy": [(1, 0.2), (2, 0.1)]}])
    assert mixed.metric == VERIFIED_LABEL and mixed.final_values == pytest.approx([0.2, 0.15])
    assert mixed.best_values == [0.3, 0.2]
    single = summarize_arm("x", [{"cooper/verified_accuracy": [(1, 0.1)]}])
    assert single.final_std is None and single.best_std is None
    assert summarize_arm("empty", [{"timing/generation": [(1, 1.0)]}]) is None


def test_stage_seconds_in_pipeline_order_without_the_total_and_alarm_steps():
    scalars = {"timing/ppo_train": [(1, 2.0)], "timing/generation": [(1, 1.0)], "timing/step_total": [(1, 9.0)],
               "timing/zz_custom": [(1, 0.1)], "timing/cooper_verify": [(1, 0.5)],
               "cooper/hacking_alarm": [(1, 0.0), (2, 1.0), (3, 1.0), (4, 0.0)]}
    assert list(stage_seconds(scalars)) == ["generation", "cooper_verify", "ppo_train", "zz_custom"]
    assert alarm_steps(scalars) == [2, 3]


def test_hacking_signature_needs_a_significant_rm_reward_rise_and_held_out_accuracy_below_start_and_rule():
    import numpy as np

    steps = np.arange(1, 21)
    noise = np.where(steps % 2 == 0, 0.05, -0.05)
    rising = {"cooper/rm_reward_mean": [(int(s), float(0.4 + 0.01 * s + e)) for s, e in zip(steps, noise)],
              "eval/accuracy": [(2, 0.40), (10, 0.30), (20, 0.20)]}
    sig = hacking_signature(rising, rule_final=0.35)
    design = np.stack([np.ones(20), steps], axis=1)
    (_, slope), rss, *_ = np.linalg.lstsq(design, np.array([v for _, v in rising["cooper/rm_reward_mean"]]), rcond=None)
    # The rise's error is Newey-West's (consecutive steps are correlated), lags floor(4 (20/100)^(2/9)) = 2.
    residuals = np.array([v for _, v in rising["cooper/rm_reward_mean"]]) - design @ np.linalg.lstsq(
        design, np.array([v for _, v in rising["cooper/rm_reward_mean"]]), rcond=None)[0]
    scores = (steps - steps.mean()) * residuals
    hac = scores @ scores + sum(2 * (1 - lag / 3) * scores[lag:] @ scores[:-lag] for lag in (1, 2))
    se = math.sqrt(hac * 20 / 18) / ((steps - steps.mean()) ** 2).sum()
    assert sig.rm_change == pytest.approx(slope * 19) and sig.rm_change_se == pytest.approx(se * 19)
    assert sig.rm_first == pytest.approx(0.42) and sig.rm_last == pytest.approx(0.59)  # 5-step means: noise -0.01, +0.01
    assert sig.rm_rises and (sig.heldout_first, sig.heldout_last) == (0.40, 0.20) and sig.shows is True
    assert hacking_signature(rising, rule_final=0.15).shows is False  # ended above the rule arm: not hacked
    assert hacking_signature(rising, rule_final=None).shows is None  # no rule arm to compare against
    flat = {**rising, "cooper/rm_reward_mean": [(int(s), float(0.5 + 2 * e)) for s, e in zip(steps, noise)]}
    assert hacking_signature(flat, rule_final=0.35).rm_rises is False and hacking_signature(flat, 0.35).shows is False
    recovered = {**rising, "eval/accuracy": [(2, 0.30), (20, 0.32)]}
    assert hacking_signature(recovered, rule_final=0.35).shows is False  # held-out ended above its start
    assert hacking_signature({"eval/accuracy": [(2, 0.3), (4, 0.1)]}, 0.35).shows is None  # rule arm: no RM reward


def test_the_report_counts_the_signature_per_arm_against_the_rule_arms_held_out_accuracy(tmp_path, capsys):
    from cooper_openrlhf.cli.report import main

    steps = range(1, 21)
    rising = [(s, 0.4 + 0.02 * s + (0.01 if s % 2 else -0.01)) for s in steps]
    flat = [(s, 0.5 + (0.01 if s % 2 else -0.01)) for s in steps]
    runs = {"rule_seed0": {"eval/accuracy": [(2, 0.40), (20, 0.42)]},
            "static_seed0": {"train/cooper/rm_reward_mean": rising, "eval/accuracy": [(2, 0.40), (20, 0.10)]},
            "static_seed1": {"train/cooper/rm_reward_mean": flat, "eval/accuracy": [(2, 0.40), (20, 0.10)]},
            "cooper_seed0": {"train/cooper/rm_reward_mean": rising, "eval/accuracy": [(2, 0.40), (20, 0.45)]}}
    for name, scalars in runs.items():
        _write_events(tmp_path / name / "tb" / "ppo_run", scalars)
    assert main([*(str(tmp_path / name) for name in runs), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "below the rule arm's mean final (0.4100)" in text
    assert "- static: in 1 of 2 run(s)" in text and "- cooper: in 0 of 1 run(s)" in text
    assert "| static | 0 | 0.46 -> 0.76 | +0.38 ± 0.00 (**yes**) | 0.40 -> 0.10 | **yes** |" in text
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [(r["arm"], r["seed"], r["shows"]) for r in summary["hacking_signature"]] == [
        ("static", 0, True), ("static", 1, False), ("cooper", 0, False)]
    # It prints what each arm logged, first -> last, and nothing of the lab's own batches (report/build.py run_lines).
    printed = capsys.readouterr().out
    assert "cooper (1 run, 20 logged steps" in printed
    assert "held-out accuracy, first -> last of 2 evaluations: 0.40 -> 0.45" in printed
    assert "static (2 runs, 20 logged steps, seeds 0, 1)" in printed
    assert "batch" not in printed and "committed result" not in printed


# ---------------------------------------------------------------------------------------------- the CLI
def _synthetic_run(folder: Path, seed: int, hacked: bool, heldout: bool) -> None:
    steps = range(1, 9)
    accuracy = [(s, 0.3 + 0.02 * s - (0.03 * s if hacked else 0) + 0.01 * seed) for s in steps]
    reward = [(s, 0.4 + (0.07 if hacked else 0.02) * s) for s in steps]
    scalars = {"train/cooper/verified_accuracy": accuracy, "train/cooper/rm_reward_mean": reward,
               "train/cooper/reward_hacking_gap": [(s, r - a) for (s, r), (_, a) in zip(reward, accuracy)],
               "train/cooper/rm_pair_accuracy": [(s, 0.8 + 0.01 * seed) for s in steps if not hacked],
               "train/cooper/hacking_alarm": [(s, float(hacked and s >= 6)) for s in steps],
               "train/timing/generation": [(s, 2.0) for s in steps], "train/timing/ppo_train": [(s, 1.0 + seed) for s in steps],
               "train/timing/cooper_verify": [(s, 0.5) for s in steps], "train/timing/step_total": [(s, 9.0) for s in steps]}
    if heldout:
        scalars["eval/accuracy"] = [(s, 0.25 + 0.05 * s / 4 + 0.02 * seed) for s in (4, 8)]
    _write_events(folder / "tb" / "ppo_run", scalars)
    _rollouts(folder / "samples", [{"step": 8, "question": "q", "reference": "4", "completion": "The answer is 5.",
                                    "verified": False, "reward": 0.95}])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from cooper_openrlhf.cli.report import main

    root = tmp_path_factory.mktemp("report")
    for seed in (0, 1):
        _synthetic_run(root / f"cooper_seed{seed}", seed, hacked=False, heldout=True)
        _synthetic_run(root / f"static_seed{seed}", seed, hacked=True, heldout=False)
    (root / "crashed_seed0").mkdir()
    runs = [root / name for name in ("cooper_seed0", "cooper_seed1", "static_seed0", "static_seed1", "crashed_seed0")]
    assert main([*map(str, runs), "--out", str(root / "out")]) == 0
    return root / "out", root


def test_report_writes_every_figure_as_a_png(report):
    out, _ = report
    for name in ("rewards_accuracy.png", "rm_pair_accuracy.png", "hacking_gap.png", "step_time.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 400_000, name


def test_report_table_gives_held_out_where_evaluated_and_labelled_verified_accuracy_elsewhere(report):
    out, root = report
    text = (out / "report.md").read_text()
    # cooper: held-out last values 0.35, 0.37 = its bests (rising); static: verified last values 0.22, 0.23, bests
    # (step 1) 0.29, 0.30.
    # Final: the mean of the last 3 evaluations of each seed (report/seed_stats.py), with its bootstrap interval.
    assert "| cooper | held-out accuracy | 0.3350 ± 0.0141 (n=2) | [0.325, 0.345] | 0.3600 ± 0.0141 (n=2) |" in text
    assert ("| static | verified accuracy (training rollouts) | 0.2350 ± 0.0071 (n=2) | [0.230, 0.240] | "
            "0.2950 ± 0.0071 (n=2) |") in text
    assert "No held-out accuracy for static" in text
    assert "**failed**: no tensorboard event files" in text and str(root / "crashed_seed0") in text
    assert "3 (first at step 6)" in text  # static's alarms at steps 6-8
    assert "reward 0.950, reference `4`, question: q" in text and "  The answer is 5." in text  # last step, unverified
    summary = json.loads((out / "summary.json").read_text())
    cooper = next(a for a in summary["arms"] if a["arm"] == "cooper")
    assert cooper["final_values"] == pytest.approx([0.325, 0.345])  # means of the last 3 evaluations
    assert [r["failed"] for r in summary["runs"]] == [False] * 4 + [True]
    assert summary["runs"][2]["hacking_alarm_steps"] == [6, 7, 8]


def test_a_published_report_shows_every_figure_small_and_no_path_of_this_machine(report, tmp_path, monkeypatch,
                                                                                   capsys):
    """What goes into docs/results: each figure the report links is there (committed reports once linked figures
    that had not been copied), smaller, looking the same; run paths relative to the folder it was published from."""
    from PIL import Image

    from cooper_openrlhf.cli.report import main
    from cooper_openrlhf.report.publish import arm_palette, figure_links, publish_report

    out, root = report
    (root / "lab.json").write_text(json.dumps({"bce_rm": str(root / "verifyrm" / "best")}))
    dest = tmp_path / "docs" / "results" / "lab"
    written = publish_report(out, dest, root=root, extra=[root / "lab.json"])
    text = (dest / "report.md").read_text()
    links = figure_links(text)
    assert links == ["rewards_accuracy.png", "rm_pair_accuracy.png", "hacking_gap.png", "step_time.png"]
    assert {p.name for p in written} == {*links, "report.md", "summary.json", "lab.json"}
    for name in links:
        assert (dest / name).stat().st_size < (out / name).stat().st_size / 2, name
        with Image.open(out / name) as before, Image.open(dest / name) as after:
            assert after.size == before.size and after.mode == "P"
            # The palette keeps the colours: on average a channel moves by less than a level, and by more than 32
            # levels only at a few anti-aliased edge pixels (under 0.1% of the values).
            diff = [abs(a - b) for a, b in zip(before.convert("RGB").tobytes(), after.convert("RGB").tobytes())]
            assert sum(diff) / len(diff) < 1.0 and sum(d > 32 for d in diff) < len(diff) / 1000, name
            # Every arm keeps its own colour, however few pixels it is drawn on (a panel title once took another's).
            before_counts = dict((rgb, n) for n, rgb in before.convert("RGB").getcolors(1 << 24))
            after_counts = dict((rgb, n) for n, rgb in after.convert("RGB").getcolors(1 << 24))
            for rgb in arm_palette():
                assert after_counts.get(rgb, 0) >= before_counts.get(rgb, 0), (name, rgb)
    for published in ("report.md", "summary.json", "lab.json"):
        assert str(root) not in (dest / published).read_text(), published
    assert "`crashed_seed0`" in text and json.loads((dest / "lab.json").read_text()) == {"bce_rm": "verifyrm/best"}
    assert json.loads((dest / "summary.json").read_text())["runs"][0]["path"] == "cooper_seed0"
    # A report that links a figure it lacks is refused, not published with a broken link.
    (out / "step_time.png").rename(tmp_path / "away.png")
    try:
        with pytest.raises(FileNotFoundError, match="step_time.png"):
            publish_report(out, tmp_path / "broken", root=root)
    finally:
        (tmp_path / "away.png").rename(out / "step_time.png")
    # The CLI: --publish next to --out, paths relative to the folder it runs in.
    monkeypatch.chdir(root)
    assert main(["cooper_seed0", "static_seed0", "--out", str(tmp_path / "again"), "--publish", "published",
                 "--publish-with", "lab.json"]) == 0
    assert set(figure_links((root / "published" / "report.md").read_text())) <= {p.name for p in (root / "published").iterdir()}
    assert str(root) not in (root / "published" / "lab.json").read_text()  # a lab's record, re-published later
    for bad, message in ((["--publish-with", "lab.json"], "--publish-with needs --publish DEST"),
                         (["--publish", "p", "--publish-with", "nothing.json"], "no such file: nothing.json")):
        with pytest.raises(SystemExit):
            main(["cooper_seed0", "--out", str(tmp_path / "bad"), *bad])
        assert message in capsys.readouterr().err


def test_report_fails_only_when_no_run_can_be_read(tmp_path):
    from cooper_openrlhf.cli.report import main

    (tmp_path / "a").mkdir()
    assert main([str(tmp_path / "a"), "--out", str(tmp_path / "out")]) == 1
    text = (tmp_path / "out" / "report.md").read_text()
    assert "**failed**" in text and "No run logged held-out or verified accuracy." in text
    assert all((tmp_path / "out" / name).is_file() for name in ("rewards_accuracy.png", "step_time.png"))



def test_an_arm_keeps_its_colour_in_every_report_whichever_arms_it_holds():
    from cooper_openrlhf.lab.arms import ARMS
    from cooper_openrlhf.report.figures import arm_colours

    full = arm_colours(["rule", "static", "cooper", "cooper_rollout_answerless"], ARMS)
    subset = arm_colours(["static", "cooper", "cooper_rollout_answerless"], ARMS)  # a report without the rule arm
    assert all(subset[arm] == full[arm] for arm in subset)
    mixed = arm_colours(["my_arm", "static", "other_arm"], ARMS)  # arms the lab does not know take colours no lab arm has
    assert mixed["static"] == full["static"] and len(set(mixed.values())) == 3


def test_the_lab_arms_colours_are_told_apart_by_hue_or_lightness():
    """Static (the frozen RM) and cooper_official were tab10's orange and brown, alike in the headline figure."""
    import colorsys

    from cooper_openrlhf.lab.arms import ARMS
    from cooper_openrlhf.report.figures import arm_colours

    arms = list(ARMS)
    colours = arm_colours(arms, arms)
    hls = {arm: colorsys.rgb_to_hls(*(int(c[i:i + 2], 16) / 255 for i in (1, 3, 5))) for arm, c in colours.items()}
    for a in arms:
        for b in arms[arms.index(a) + 1:]:
            (ha, la, sa), (hb, lb, sb) = hls[a], hls[b]
            hue_apart = min(abs(ha - hb), 1 - abs(ha - hb)) * 360 >= 30 and min(sa, sb) > 0.3
            grey_and_colour = (sa < 0.1) != (sb < 0.1)
            assert hue_apart or grey_and_colour or abs(la - lb) >= 0.3, (a, colours[a], b, colours[b])


def test_the_held_out_panel_is_fitted_to_its_data_not_to_0_1(tmp_path):
    from cooper_openrlhf.report.figures import fitted_limits, rewards_accuracy
    from cooper_openrlhf.report.runs import RunData

    def run(arm, seed, heldout):
        return RunData(path=tmp_path / f"{arm}{seed}", arm=arm, seed=seed,
                       scalars={"eval/accuracy": [(s, v) for s, v in zip((2, 4, 6), heldout)],
                                "cooper/rm_reward_mean": [(s, 0.5) for s in range(1, 7)]})

    arms = {"rule": [run("rule", 0, [0.15, 0.16, 0.15]), run("rule", 1, [0.14, 0.15, 0.18])],
            "static": [run("static", 0, [0.15, 0.10, 0.08]), run("static", 1, [0.16, 0.11, 0.09])]}
    low, high = rewards_accuracy(arms, {"rule": "#0072b2", "static": "#d55e00"}, tmp_path / "f.png")
    assert 0.0 < low <= 0.08 and 0.18 <= high < 0.3  # the 0.08-0.18 the curves span, with a margin
    assert fitted_limits([0.0, 1.0]) == (-0.02, 1.02) and fitted_limits([0.5]) == pytest.approx((0.48, 0.52))


def test_the_figures_curve_is_a_smoothed_seed_mean_with_a_standard_error_band():
    from cooper_openrlhf.report.aggregate import smoothed_band, trailing_mean

    assert trailing_mean([(1, 1.0), (2, 3.0), (3, 5.0)], 2) == [(1, 1.0), (2, 2.0), (3, 4.0)]
    b = smoothed_band([[(1, 0.0), (2, 1.0)], [(1, 1.0), (2, 1.0)]], window=2)
    assert b.steps == [1, 2] and b.mean == pytest.approx([0.5, 0.75])
    # Seed values at step 2: 0.5 and 1.0 -> standard error 0.25 (std 0.354 over sqrt 2 seeds).
    assert b.high[1] - b.mean[1] == pytest.approx(0.25) and b.mean[1] - b.low[1] == pytest.approx(0.25)
    one = smoothed_band([[(1, 0.2), (2, 0.4)]], window=1)
    assert one.low == one.mean == one.high == [0.2, 0.4]


def test_every_figure_is_at_most_1600_px_wide(report):
    from PIL import Image

    out, _ = report
    for name in ("rewards_accuracy.png", "rm_pair_accuracy.png", "hacking_gap.png", "step_time.png"):
        with Image.open(Path(out) / name) as image:
            assert image.width <= 1600, (name, image.size)
