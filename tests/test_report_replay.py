"""Re-judging logged runs (report/replay.py, cli/replay_monitor.py) and reading what a run's policy wrote
(cli/rollouts.py): the hacking rule replayed over a run's scalars and rollout log, and the rollout log's exports."""

import json

import pytest

from run_folders import write_events as _write_events


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

