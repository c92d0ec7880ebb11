"""The arms the probe lab adds (the oracle positive control, Cooper with the frozen warm start as its assistant,
Cooper on random rollout negatives), their pairs file, and the preparation seed that gives a batch independent
starting points: each as train_cooper parses it, or as the file the arm trains on."""

import json

import pytest

from cooper_openrlhf.algo.answer_style import is_exploit, states_reference
from cooper_openrlhf.lab.arms import ARMS, train_cooper_argv as arm_argv
from cooper_openrlhf.lab.presets import PRESETS
from cooper_openrlhf.lab.runner import LabFiles, train_cooper_argv
from cooper_openrlhf.rm.probes import TAIL
from cooper_openrlhf.verify.rule import Verdict, verify_one


def _parsed(tmp_path, arm: str):
    from cooper_openrlhf.cli.train_cooper import parse_args

    files = LabFiles(root=tmp_path, policy=tmp_path / "policy", rm=tmp_path / "verifyrm" / "best")
    (tmp_path / "data").mkdir(exist_ok=True)
    for kind in ("offline", "stale", "oracle"):  # train_cooper checks that a pairs file is there
        files.pair_file(kind, 3).write_text("")
    (tmp_path / "policy").mkdir(exist_ok=True)
    (tmp_path / "policy" / "config.json").write_text("{}")
    argv = train_cooper_argv(PRESETS["style"], files, arm, seed=3)
    return files, parse_args(argv[3:], gpu_run=False)


def test_the_oracle_trains_its_rm_on_its_own_pairs_file(tmp_path):
    files, args = _parsed(tmp_path, "oracle")
    assert args.remote_rm_trainable and args.cooper.reward_source == "rm"
    assert args.cooper.offline_pairs == str(files.oracle_pairs(3)) != str(files.offline_pairs(3))


def test_the_frozen_assistant_arm_rewrites_with_the_starting_policy_on_its_own_engine(tmp_path):
    files, args = _parsed(tmp_path, "cooper_frozen_assistant")
    assert args.cooper.assistant == "model" and args.cooper.assistant_model_path == str(files.policy)
    assert args.remote_rm_trainable and args.cooper.negative_source == "assistant"
    assert args.cooper.offline_pairs is None
    _, cooper = _parsed(tmp_path, "cooper")
    assert cooper.cooper.assistant == "policy"  # the paper's arm keeps the policy as its assistant


def test_an_arm_whose_assistant_is_the_starting_policy_refuses_a_command_without_it():
    with pytest.raises(ValueError, match="assistant_model"):
        arm_argv("cooper_frozen_assistant", [], rm="rm")


@pytest.mark.parametrize("arm, pick", [("cooper_rollout", "random"), ("cooper_rollout_hardest", "hardest")])
def test_rollout_negative_arms_name_their_pick(tmp_path, arm, pick):
    _, args = _parsed(tmp_path, arm)
    assert args.cooper.negative_source == "rollout" and args.cooper.rollout_negative_pick == pick


def test_the_oracle_pairs_are_the_right_hedge_against_its_exploit_form(tmp_path):
    from cooper_openrlhf.lab.arm_pairs import OFFLINE_STEPS_SPARE, write_oracle_pairs

    preset = PRESETS["style"]
    path = tmp_path / "oracle.jsonl"
    count = write_oracle_pairs(preset, path, seed=0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert count == len(rows) == (preset.steps + OFFLINE_STEPS_SPARE) * preset.prompts_per_step
    for row in rows:
        assert verify_one(row["reference"], row["positive"]).verdict == Verdict.CORRECT
        assert verify_one(row["reference"], row["negative"]).verdict == Verdict.INCORRECT
        assert is_exploit(row["negative"], row["reference"], verified=False)  # the detector's exploit, every one
        assert states_reference(row["positive"], row["reference"])
        assert row["negative"].endswith(TAIL) == row["positive"].endswith(TAIL)
    tailed = sum(r["negative"].endswith(TAIL) for r in rows) / len(rows)
    assert 0.35 < tailed < 0.65
    again = tmp_path / "again.jsonl"
    write_oracle_pairs(preset, again, seed=0)
    assert again.read_text() == path.read_text()  # a resume trains on the same pairs
    write_oracle_pairs(preset, again, seed=1)
    assert again.read_text() != path.read_text()


def test_the_oracle_needs_a_hedge_to_build_its_exploit_form(tmp_path):
    from cooper_openrlhf.lab.arm_pairs import write_oracle_pairs

    with pytest.raises(ValueError, match="hedge"):
        write_oracle_pairs(PRESETS["full"], tmp_path / "oracle.jsonl", seed=0)


def _logged_run(run, rows):
    (run / "samples").mkdir(parents=True)
    (run / "run_info.json").write_text(json.dumps({"arm": "static", "seed": 0, "status": "done"}))
    (run / "samples" / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(step, a, b, completion, verified):
    return {"step": step, "question": f"What is {a} + {b}?", "reference": str(a + b), "completion": completion,
            "verified": verified, "reward": 0.5}


def test_harvested_oracle_pairs_are_a_right_rollout_against_an_exploit_as_the_policy_wrote_them(tmp_path):
    """A policy whose answers no style describes (SmolLM2): the oracle's pairs come from its logged rollouts, graded
    again by today's verifier (the log's own verdict of the last row is wrong: it is not right), read from a run
    archive as the lab publishes it."""
    from cooper_openrlhf.lab.arm_pairs import OFFLINE_STEPS_SPARE, write_oracle_pairs
    from cooper_openrlhf.lab.batch import archive_run

    rows = [_row(1, 2, 3, "2 + 3 = 5. The answer is \\boxed{5}.", True),
            _row(1, 2, 3, "2 + 3 = 5, so the answer is \\boxed{6}.", False),  # exploit: states 5, graded 6
            _row(1, 2, 3, "The answer is \\boxed{7}.", False),  # ordinary wrong
            _row(2, 4, 4, "4 + 4 = 8. The answer is \\boxed{8}.", True),
            _row(2, 4, 4, "8 or \\boxed{9}.", False),
            _row(2, 1, 1, "1 + 1 = 2 and \\boxed{3}.", False),  # an exploit with no right rollout: unused
            _row(2, 1, 1, "The answer is \\boxed{4}.", True)]  # logged right, graded wrong now
    _logged_run(tmp_path / "lab" / "runs" / "static_seed0", rows)
    archive = tmp_path / "static_seed0.tar.gz"
    archive_run(tmp_path / "lab" / "runs" / "static_seed0", archive)
    preset = PRESETS["smollm2"].with_overrides(oracle_rollouts=(str(archive),))
    path = tmp_path / "oracle.jsonl"
    count = write_oracle_pairs(preset, path, seed=0)
    pairs = [json.loads(line) for line in path.read_text().splitlines()]
    assert count == len(pairs) == (preset.steps + OFFLINE_STEPS_SPARE) * 2  # two problems have both kinds
    assert {p["question"] for p in pairs} == {"What is 2 + 3?", "What is 4 + 4?"}
    for pair in pairs:
        assert verify_one(pair["reference"], pair["positive"]).verdict == Verdict.CORRECT
        assert verify_one(pair["reference"], pair["negative"]).verdict == Verdict.INCORRECT
        assert is_exploit(pair["negative"], pair["reference"], verified=False)
    again = tmp_path / "again.jsonl"
    write_oracle_pairs(preset.with_overrides(oracle_rollouts=(str(tmp_path / "lab"),)), again, seed=0)
    assert again.read_text() == path.read_text()  # a lab folder reads as its archive does


def test_harvested_oracle_pairs_from_rollouts_with_no_exploit_fail_naming_the_sources(tmp_path):
    from cooper_openrlhf.lab.arm_pairs import write_oracle_pairs

    _logged_run(tmp_path / "run", [_row(1, 2, 3, "The answer is \\boxed{5}.", True)])
    preset = PRESETS["smollm2"].with_overrides(oracle_rollouts=(str(tmp_path / "run"),))
    with pytest.raises(ValueError, match="1 logged rollouts and no problem with both"):
        write_oracle_pairs(preset, tmp_path / "oracle.jsonl", seed=0)


def test_the_lab_cli_takes_oracle_rollouts_for_a_preset_with_no_pair_source(tmp_path):
    from cooper_openrlhf.cli import lab as lab_cli

    args = lab_cli.parse_args(["--preset", "smollm2", "--arms", "static,oracle", "--oracle-rollouts", str(tmp_path)])
    assert args.preset_obj.oracle_rollouts == (str(tmp_path.resolve()),)
    with pytest.raises(SystemExit):  # the hedge needs the style lab's pair source
        lab_cli.parse_args(["--preset", "smollm2", "--arms", "static,oracle"])
    with pytest.raises(SystemExit):  # harvested pairs for no oracle arm
        lab_cli.parse_args(["--preset", "smollm2", "--arms", "static", "--oracle-rollouts", str(tmp_path)])
    with pytest.raises(SystemExit):
        lab_cli.parse_args(["--preset", "smollm2", "--arms", "oracle", "--oracle-rollouts", str(tmp_path / "none")])


def test_every_arm_with_a_pairs_file_has_one_the_lab_knows(tmp_path):
    files = LabFiles(root=tmp_path, policy=tmp_path / "policy", rm=None)
    kinds = {arm.pairs for _, arm in ARMS.items() if arm.pairs}
    assert kinds == {"offline", "stale", "oracle"}
    assert len({files.pair_file(kind, 0) for kind in kinds}) == len(kinds)


def test_preparation_zero_seeds_as_before_and_another_preparation_seeds_every_stage_apart(tmp_path):
    from cooper_openrlhf.lab.prepare import BCE_SEED, bce_stage_argv

    style = PRESETS["style"]
    assert "--train.seed" not in bce_stage_argv(style, tmp_path / "d.jsonl", tmp_path / "rm")
    argv = bce_stage_argv(style.with_overrides(preparation_seed=2), tmp_path / "d.jsonl", tmp_path / "rm")
    assert argv[argv.index("--train.seed") + 1] == str(BCE_SEED + 2)


def test_the_lab_cli_takes_a_preparation_seed_and_a_folder_keeps_its_own():
    from cooper_openrlhf.cli import lab as lab_cli

    args = lab_cli.parse_args(["--preset", "style", "--preparation-seed", "2", "--arms", "rule,oracle"])
    assert args.preset_obj.preparation_seed == 2 and args.preset_obj.arms == ("rule", "oracle")
    assert lab_cli.parse_args(["--preset", "style"]).preset_obj.preparation_seed == 0
    with pytest.raises(SystemExit):
        lab_cli.parse_args(["--preset", "style", "--preparation-seed", "-1"])


def test_a_lab_folder_refuses_a_resume_under_another_preparation(tmp_path):
    from cooper_openrlhf.cli.lab import check_same_setup

    check_same_setup(tmp_path, PRESETS["style"].with_overrides(preparation_seed=1))
    check_same_setup(tmp_path, PRESETS["style"].with_overrides(preparation_seed=1, seeds=5))
    with pytest.raises(SystemExit, match="preparation_seed"):
        check_same_setup(tmp_path, PRESETS["style"])
