"""The run report (cooper_openrlhf/report/, cli/report.py) on event files written here with OpenRLHF's own writer
(torch's SummaryWriter, `train/` and `eval/` tags as its TensorboardLogger writes them): identity, reading and
merging, hand-worked aggregation, and the CLI over several arms and seeds with a failed run."""

import json
import math
from pathlib import Path

import pytest

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
from cooper_openrlhf.report.runs import load_run, merge_points, metric_name, read_rollout_log, read_scalars, run_identity


def _write_events(folder: Path, scalars: dict[str, list[tuple[int, float]]]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    for tag, points in scalars.items():
        for step, value in points:
            writer.add_scalar(tag, value, step)
    writer.close()


def _rollouts(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


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
    # It reads the runs against the paper's claim, as a lab's last lines do (lab/reading.py).
    printed = capsys.readouterr().out
    assert "Cooper: held-out accuracy 0.40 -> 0.45, the rule-reward arm's 0.40 -> 0.42: level with the rule reward" in printed
    assert "One seed per arm cannot show this reliably" in printed


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


# ------------------------------------------------------------------------------- re-judging logged runs
def _hacking_shaped(held_out_after: float, samples: float | None = None) -> dict[str, list[tuple[int, float]]]:
    """Steps 1-4: RM reward rising as fast as verified accuracy (no gap); held-out 0.5 at step 1, then lower at 3."""
    scalars = {"cooper/rm_reward_mean": [(s, 0.4 + 0.1 * s) for s in range(1, 5)],
               "cooper/verified_accuracy": [(s, 0.4 + 0.1 * s) for s in range(1, 5)],
               "eval/accuracy": [(1, 0.5), (3, held_out_after)],
               "cooper/hacking_alarm": [(s, float(s == 4)) for s in range(1, 5)]}
    if samples is not None:
        scalars["eval/samples"] = [(1, samples), (3, samples)]
    return scalars


def test_replay_feeds_an_evaluation_to_the_step_after_it_as_training_does():
    from cooper_openrlhf.algo.hacking import HackingMonitorConfig
    from cooper_openrlhf.report.replay import replay_monitor

    config = HackingMonitorConfig(window=3, rise_per_step=0.05)
    replay = replay_monitor(_hacking_shaped(0.2, samples=1000), config)
    assert [step for step, _ in replay.verdicts] == [1, 2, 3, 4]
    # the step-3 evaluation reaches the guard at step 4
    assert replay.alarm_steps == [4] and replay.rules == ["heldout_falls"]
    assert replay.logged_alarm_steps == [4]
    # 0.5 -> 0.4 is a 0.1 drop: beyond the 0.05 floor when the held-out size is unknown, noise at 128 samples
    assert replay_monitor(_hacking_shaped(0.4), config).alarm_steps == [4]
    assert replay_monitor(_hacking_shaped(0.4), config, heldout_samples=128).alarm_steps == []
    assert replay_monitor(_hacking_shaped(0.4, samples=4000), config, heldout_samples=128).alarm_steps == [4]


def test_replay_cli_prints_logged_and_replayed_alarms_per_run(tmp_path, capsys):
    from cooper_openrlhf.cli import replay_monitor as cli

    for name, held_out in (("static_seed0", 0.2), ("cooper_seed0", 0.5)):
        _write_events(tmp_path / name / "tb", {(k if k.startswith("eval/") else "train/" + k): v
                                               for k, v in _hacking_shaped(held_out, samples=1000).items()})
    runs = [str(tmp_path / "static_seed0"), str(tmp_path / "cooper_seed0")]
    assert cli.main([*runs, "--cooper.hacking_window", "3", "--cooper.hacking_rise_per_step", "0.05"]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = {line.split()[0]: line.split() for line in out[1:3]}
    # ... rules, held-out first / lowest@step / last, the gap's step-to-step noise (RM reward = accuracy: 0)
    # and no wrong-rollout reward (neither logged nor a rollout log to take it from): "-"
    assert lines["static_seed0"][1:] == ["static", "0", "1", "1", "4", "heldout_falls", "0.50", "0.20@3", "0.20", "0.000", "-"]
    assert lines["cooper_seed0"][1:] == ["cooper", "0", "1", "0", "-", "-", "0.50", "0.50@1", "0.50", "0.000", "-"]
    # the step-3 evaluation reaches the guard at step 4: an alarm on it comes with the whole fall behind it
    assert out[5:] == ["static: alarm on 1 of 1 runs (0 early, 0 in a closed episode)",
                       "cooper: alarm on 0 of 1 runs (0 early, 0 in a closed episode)"]
    assert cli.main([*runs, "--cooper.hacking_window", "3", "--cooper.hacking_rise_per_step", "0.05",
                     "--held-at", "0.3"]) == 0
    assert capsys.readouterr().out.splitlines()[5:] == [
        "static: alarm on 1 of 1 runs (0 early, 0 in a closed episode) | ended >= 0.3: alarm on 0 of 0 runs "
        "(0 early, 0 in a closed episode) | ended below: alarm on 1 of 1 runs (0 early, 0 in a closed episode)",
        "cooper: alarm on 0 of 1 runs (0 early, 0 in a closed episode) | ended >= 0.3: alarm on 0 of 1 runs "
        "(0 early, 0 in a closed episode) | ended below: alarm on 0 of 0 runs (0 early, 0 in a closed episode)"]
    with pytest.raises(SystemExit, match="window must be >= 3"):
        cli.main([*runs, "--cooper.hacking_window", "2"])


def test_verdict_rewards_come_from_the_rollout_log_only_where_the_rm_paid_and_never_replace_logged_ones():
    from cooper_openrlhf.report.runs import scalars_with_verdict_rewards

    scalars = {"cooper/rm_reward_mean": [(1, 0.5), (2, 0.5), (3, 0.5)], "cooper/reward_from_rule": [(3, 1.0)]}
    rows = [{"step": step, "verified": verified, "reward": reward}
            for step in (1, 2, 3, 4) for verified, reward in ((True, 0.9), (False, 0.1 * step), (False, 0.3 * step))]
    filled = scalars_with_verdict_rewards(scalars, rows)  # step 3 paid by the rule, step 4 not scored by the RM
    assert [step for step, _ in filled["cooper/rm_reward_wrong_mean"]] == [1, 2]
    assert [value for _, value in filled["cooper/rm_reward_wrong_mean"]] == pytest.approx([0.2, 0.4])
    assert [value for _, value in filled["cooper/rm_reward_correct_mean"]] == pytest.approx([0.9, 0.9])
    logged = {**scalars, "cooper/rm_reward_wrong_mean": [(1, 0.7)]}
    assert scalars_with_verdict_rewards(logged, rows) is logged


def test_wrong_reward_course_by_hand():
    from cooper_openrlhf.report.replay import WrongRewardCourse, wrong_reward_course

    scalars = {"cooper/rm_reward_wrong_mean": [(1, 0.1), (2, 0.1), (3, 0.4), (4, 0.4), (5, 0.1)]}
    # 2-step means ending at steps 2..5: .1, .25, .4, .25
    assert wrong_reward_course(scalars, span=2) == WrongRewardCourse(pytest.approx(0.1), pytest.approx(0.4), 4,
                                                                      pytest.approx(0.25))
    assert wrong_reward_course(scalars, span=6) is None and wrong_reward_course({}) is None
    course = wrong_reward_course(scalars, span=2)
    assert not course.closed_episode(0.2)  # rose .3 (>= .2), but ends .15 above its start (> .1)
    assert course.closed_episode(0.3)  # rose .3 (>= .3), ends .15 above (<= .15)
    assert not course.closed_episode(0.35)  # never rose that far


def test_replay_cli_takes_rule_fs_input_from_the_rollout_log_of_a_run_that_did_not_log_it(tmp_path, capsys):
    from cooper_openrlhf.cli import replay_monitor as cli

    steps = range(1, 11)
    wrong = {step: 0.2 if step <= 4 else 0.8 for step in steps}  # the RM starts paying wrong answers at step 5
    _write_events(tmp_path / "static_seed0" / "tb", {"train/cooper/rm_reward_mean": [(s, 0.5) for s in steps],
                                                      "train/cooper/verified_accuracy": [(s, 0.5) for s in steps]})
    rows = [{"step": s, "question": "q", "reference": "1", "completion": c, "verified": c == "1", "reward": r}
            for s in steps for c, r in (("1", 0.9), ("2", wrong[s]))]
    samples = tmp_path / "static_seed0" / "samples"
    samples.mkdir()
    (samples / "rollouts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert cli.main([str(tmp_path / "static_seed0"), "--cooper.hacking_window", "4", "--cooper.hacking_rules", "F"]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = lines[1].split()
    # baseline .2, allowance .1: the sum is .5 at step 5 (one jump: within its noise), 1.0 at step 6
    assert line[4:7] == ["5", "6", "wrong_paid_more"]  # alarms at steps 6-10, the first at 6 (the letter F still names it)
    # 5-step means of what the RM paid wrong rollouts: steps 1-5 (.2 x 4, .8), the first all-.8 stretch, the last
    assert line[-3:] == ["0.32", "0.80@9", "0.80"]
    assert lines[-1] == "static: alarm on 1 of 1 runs (0 early, 0 in a closed episode)"  # paid .8 to the end


def test_alarm_outcome_measures_how_much_of_the_held_out_fall_was_behind_the_first_alarm():
    from cooper_openrlhf.report.replay import alarm_outcome

    scalars = {"eval/accuracy": [(2, 0.40), (4, 0.30), (6, 0.10), (8, 0.20)]}  # fall .40 -> .10 (step 6)
    early = alarm_outcome(scalars, [5, 6], held_at=0.25)  # had seen step 4's .30: a third of the fall
    assert (early.held, early.first_alarm, early.lowest_step) == (False, 5, 6)
    assert early.fall_done == pytest.approx(1 / 3) and early.early
    late = alarm_outcome(scalars, [7], held_at=0.15)  # had seen step 6's .10: all of it
    assert late.held and late.fall_done == pytest.approx(1.0) and not late.early
    before_any = alarm_outcome(scalars, [2], held_at=0.25)  # no evaluation seen yet: nothing behind it
    assert before_any.fall_done == 0.0 and before_any.early
    silent = alarm_outcome(scalars, [], held_at=0.25)
    assert silent.first_alarm is None and silent.fall_done is None and not silent.early
    assert alarm_outcome({}, [3], held_at=0.25).held is None  # never evaluated


def test_gap_step_noise_is_the_scatter_of_successive_steps_not_the_trend():
    from cooper_openrlhf.report.replay import gap_step_noise

    # gaps 0, .1, 0, .1: differences .1, -.1, .1 (sample variance 1/75) -> sqrt(1/75 / 2) = 0.0816
    zigzag = {"cooper/reward_hacking_gap": [(1, 0.0), (2, 0.1), (3, 0.0), (4, 0.1)]}
    assert gap_step_noise(zigzag) == pytest.approx((1 / 150) ** 0.5)
    trend = {"cooper/rm_reward_mean": [(s, 0.5 + 0.1 * s) for s in range(1, 5)],  # the gap from its two parts
             "cooper/verified_accuracy": [(s, 0.5) for s in range(1, 5)]}
    assert gap_step_noise(trend) == pytest.approx(0.0)  # a steady climb is a trend, not noise
    assert gap_step_noise({"cooper/reward_hacking_gap": [(1, 0.0), (2, 0.5)]}) is None
    assert gap_step_noise({"cooper/verified_accuracy": [(1, 0.5)] * 5}) is None  # the rule arm has no gap


def test_alarm_timing_gives_held_out_accuracy_the_guard_had_seen_when_it_first_alarmed():
    from cooper_openrlhf.report.aggregate import alarm_timing

    scalars = {"eval/accuracy": [(2, 0.40), (4, 0.30), (6, 0.05), (8, 0.05), (10, 0.10)],
               "cooper/hacking_alarm": [(s, float(s >= 4)) for s in range(1, 11)]}
    timing = alarm_timing(scalars)
    # the alarm at step 4 had seen the step-2 evaluation only (step 4's is logged after the step's metrics)
    assert (timing.first, timing.at_first_alarm, timing.lowest, timing.lowest_step) == (0.40, 0.40, 0.05, 6)
    assert alarm_timing({"eval/accuracy": [(2, 0.4)]}).at_first_alarm is None  # never alarmed
    assert alarm_timing({"cooper/hacking_alarm": [(1, 1.0)]}).first is None  # never evaluated


def test_rollouts_export_as_triples_that_the_recipe_trains_on_and_eval_verifier_reads(tmp_path, capsys):
    """`cli.rollouts --export`: a run's logged rollouts, labelled by the rule verdict the run logged, in the two
    formats the package reads back: the VerifyRM recipe's (`verifyrm train`) and VerifyBench's (`eval_verifier`)."""
    import json

    from cooper_openrlhf.cli.rollouts import main as rollouts_main
    from cooper_openrlhf.data.benchmarks import load_benchmark
    from cooper_openrlhf.report.rollouts import rollout_triples
    from cooper_openrlhf.rm.data import load_labelled

    rows = [{"step": step, "question": f"What is {step} + 1?", "reference": str(step + 1),
             "completion": f"The answer is {answer}.", "verified": answer == step + 1, "reward": 0.5}
            for step, answer in [(1, 2), (1, 7), (2, 3), (3, 9)]]
    run = tmp_path / "static_seed0" / "samples"
    run.mkdir(parents=True)
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    recipe = tmp_path / "own.jsonl"
    assert rollouts_main([str(tmp_path / "static_seed0"), "--export", str(recipe)]) == 0
    assert "exported 4 rollouts (2 verified) of 1 run(s)" in capsys.readouterr().out  # every step, not the last three
    triples = load_labelled(recipe)
    assert [(t.question, t.reference, t.completion, t.label) for t in triples] == [
        (r["question"], r["reference"], r["completion"], int(r["verified"])) for r in rows]

    bench = tmp_path / "own_verifybench.jsonl"
    assert rollouts_main([str(tmp_path / "static_seed0"), "--steps", "2-3", "--export", str(bench),
                          "--export-format", "verifybench"]) == 0
    examples = load_benchmark("verifybench", bench).records
    assert [(e.question, e.reference, e.gold_correct) for e in examples] == [
        ("What is 2 + 1?", "3", True), ("What is 3 + 1?", "4", False)]

    with pytest.raises(ValueError, match="unknown export format 'csv'"):
        rollout_triples(rows, 1, 3, fmt="csv")
    (run / "rollouts.jsonl").write_text(json.dumps({**rows[0], "question": None}) + "\n")
    with pytest.raises(SystemExit):
        rollouts_main([str(tmp_path / "static_seed0"), "--export", str(recipe)])
    assert "rollouts.jsonl: the rollout at step 1 has no text field 'question'" in capsys.readouterr().err


def test_rollout_window_gives_what_the_policy_wrote_and_was_paid_over_the_steps_asked(tmp_path, capsys):
    import json

    from cooper_openrlhf.cli.rollouts import main as rollouts_main
    from cooper_openrlhf.report.rollouts import rollout_window

    rows = [{"step": 1, "completion": "The answer is 4.", "verified": True, "reward": 0.9},
            {"step": 2, "completion": "The answer is.", "verified": False, "reward": 0.8},
            {"step": 2, "completion": "The answer is.", "verified": False, "reward": 0.6},
            {"step": 3, "completion": "The answer is 5.", "verified": True, "reward": 0.4}]
    window = rollout_window(rows, 2, 3, top=1)
    assert (window.rollouts, window.verified) == (3, pytest.approx(1 / 3))
    assert window.mean_reward == pytest.approx(0.6)
    assert (window.reward_verified, window.reward_unverified) == (pytest.approx(0.4), pytest.approx(0.7))
    assert window.common == [("The answer is.", 2)]
    assert window.best_paid == [("The answer is.", 0.8, False)]
    assert window.common_wrong == [("The answer is.", 2, pytest.approx(0.7))]  # what the blind spot pays
    with pytest.raises(ValueError, match="no rollout logged at steps 7-9"):
        rollout_window(rows, 7, 9)

    run = tmp_path / "static_seed0" / "samples"
    run.mkdir(parents=True)
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rollouts_main([str(tmp_path / "static_seed0")]) == 0  # default: the last three logged steps
    out = capsys.readouterr().out
    assert "steps 1-3: 4 rollouts, mean reward 0.675, verified 0.50" in out
    assert "most common wrong: 'The answer is.' (2) paid 0.700" in out
    with pytest.raises(SystemExit):
        rollouts_main([str(tmp_path / "static_seed0"), "--steps", "5-2"])
    assert "the first step comes after the last" in capsys.readouterr().err
    (run / "rollouts.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match="rollouts.jsonl, line 1: not a rollout row"):
        rollouts_main([str(tmp_path / "static_seed0")])

    # --heldout reads the held-out evaluations' log; a run without an RM logs their reward as null.
    with pytest.raises(SystemExit):
        rollouts_main([str(tmp_path / "static_seed0"), "--heldout"])
    assert "no heldout.jsonl (was the run started with --cooper.sample_log_dir and --eval.dataset?)" in capsys.readouterr().err
    held_out = [{**rows[0], "step": 2}, {**rows[1], "step": 2, "reward": None}]
    (run / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_out))
    assert rollouts_main([str(tmp_path / "static_seed0"), "--heldout", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "steps 0-2: 2 rollouts, mean reward 0.900, verified 0.50, reward verified 0.900 / unverified -" in out
    unpaid = rollout_window([{**row, "reward": None} for row in held_out], 2, 2)
    assert unpaid.mean_reward is None and unpaid.best_paid == [] and unpaid.verified == 0.5


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
    from cooper_openrlhf.report.plan_verdict import TRAINING_WINDOW, exploit_rate
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
