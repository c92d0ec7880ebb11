"""The lab's evidence: the control arm, the clean held-out set, the BCE chance check, the official negative rule, the
candidate choice by rank."""

import json
from pathlib import Path

import pytest

from cooper_openrlhf.cli import lab as lab_cli
from cooper_openrlhf.lab.presets import PRESETS
from cooper_openrlhf.lab.runner import LabFiles, train_cooper_argv
from cooper_openrlhf.lab.task import equivalence_key, problem_family, task_split, warm_start_problems


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_no_held_out_problem_is_trained_on_or_has_a_trivial_twin_in_training(preset):
    spec = PRESETS[preset].task
    train, held = task_split(spec)
    assert len(held) == spec.heldout and len(train) + len(held) == len(problem_family(spec))
    trained = {p.question for p in train} | {p.question for p in warm_start_problems(spec)}
    assert not trained & {p.question for p in held}  # the warm start never sees a held-out problem
    trained_keys = {equivalence_key(q) for q in trained}
    assert not trained_keys & {equivalence_key(p.question) for p in held}  # nor a commuted / equivalent twin


def test_equivalence_keys_pair_commuted_and_trivially_equal_problems_only():
    assert equivalence_key("What is 3 + 7?") == equivalence_key("What is 7 + 3?")
    assert equivalence_key("What is 4 * 6?") == equivalence_key("What is 6 * 4?")
    assert equivalence_key("What is 5 - 5?") == equivalence_key("What is 9 - 9?")  # every x - x is 0
    assert equivalence_key("What is 7 - 3?") != equivalence_key("What is 3 - 7?")
    assert equivalence_key("What is 3 + 7?") != equivalence_key("What is 4 + 6?")  # equal answers are not twins
    assert equivalence_key("Mia has 4 apples. Mia buys 2 bags with 5 apples in each bag. How many apples does Mia "
                           "have now?") == \
        equivalence_key("Leo has 4 apples. Leo buys 5 bags with 2 apples in each bag. How many apples does Leo have now?")


def _files(root: Path) -> LabFiles:
    return LabFiles(root=root, policy=root / "policy", rm=root / "verifyrm" / "best")


def test_the_offline_pairs_command_differs_from_coopers_only_in_where_its_pairs_come_from(tmp_path):
    full, files = PRESETS["full"], _files(tmp_path)
    cooper = train_cooper_argv(full, files, "cooper", 3)
    offline = train_cooper_argv(full, files, "offline_pairs", 3)
    extra = ["--cooper.offline_pairs", str(files.offline_pairs(3))]
    at = offline.index("--cooper.offline_pairs")
    assert offline[at:at + 2] == extra
    assert [a.replace("offline_pairs_seed3", "cooper_seed3") for a in offline[:at] + offline[at + 2:]] == cooper
    official = train_cooper_argv(full, files, "cooper_official", 3)
    at = official.index("--cooper.negative_validity")
    assert official[at:at + 2] == ["--cooper.negative_validity", "official"]
    assert [a.replace("cooper_official_seed3", "cooper_seed3") for a in official[:at] + official[at + 2:]] == cooper


@pytest.mark.parametrize("argv, message", [
    (["--preset", "full", "--arms", "cooper,offline_pairs", "--rm-pair-steps", "0"], "no pair source (--rm-pair-steps 0)"),
    (["--preset", "full", "--arms", "offline_pairs", "--rm-choice", "median", "--rm-candidate", "3"], "--rm-choice"),
    (["--preset", "full", "--rm-choice", "worst"], "invalid choice: 'worst'"),
])
def test_an_arm_without_its_pair_source_or_a_bad_choice_fails_at_start(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        lab_cli.parse_args(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_the_full_presets_own_arms_from_a_given_rm_leave_the_control_out_and_say_so(tmp_path, caplog):
    rm = tmp_path / "my-rm"
    rm.mkdir()
    (rm / "config.json").write_text("{}")
    with caplog.at_level("WARNING", logger="cooper_openrlhf.lab"):
        args = lab_cli.parse_args(["--preset", "full", "--rm", str(rm)])
    assert "offline_pairs" in PRESETS["full"].arms
    assert args.arm_list == [arm for arm in PRESETS["full"].arms if arm != "offline_pairs"]
    assert "the preset's offline_pairs arm is left out" in caplog.text
    with pytest.raises(SystemExit):  # asked for by name, it is still refused
        lab_cli.parse_args(["--preset", "full", "--rm", str(rm), "--arms", "cooper,offline_pairs"])


def test_offline_pairs_files_are_fresh_each_step_and_load_as_valid_pair_batches(tmp_path):
    from cooper_openrlhf.algo.offline_pairs import load_offline_pairs, offline_batch
    from cooper_openrlhf.lab.arm_pairs import OFFLINE_STEPS_SPARE, write_offline_pairs

    quick = PRESETS["quick"]
    path = tmp_path / "pairs.jsonl"
    assert write_offline_pairs(quick, path, seed=0) == (quick.steps + OFFLINE_STEPS_SPARE) * quick.prompts_per_step
    groups = load_offline_pairs(path)
    assert len(groups) == quick.steps + OFFLINE_STEPS_SPARE and all(g.num_valid == quick.prompts_per_step for g in groups)
    held = {p.question for p in task_split(quick.task)[1]}
    assert not held & {q for g in groups for q in g.questions}  # train problems only
    assert offline_batch(groups, 1) is groups[1] and offline_batch(groups, len(groups)) is groups[0]
    first = groups[0]
    assert first.positives[0] == f"The answer is {first.references[0]}." and first.negatives[0] != first.positives[0]
    assert write_offline_pairs(quick, tmp_path / "again.jsonl", seed=0) and \
        (tmp_path / "again.jsonl").read_text() == path.read_text()  # deterministic
    write_offline_pairs(quick, tmp_path / "other.jsonl", seed=1)
    assert (tmp_path / "other.jsonl").read_text() != path.read_text()  # each seed its own pairs


def test_a_bad_offline_pairs_file_is_a_clear_error(tmp_path):
    from cooper_openrlhf.algo.offline_pairs import load_offline_pairs

    with pytest.raises(FileNotFoundError, match="no such file"):
        load_offline_pairs(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"step": 0, "question": "q", "reference": "1", "positive": "a"}))
    with pytest.raises(ValueError, match=r"line 1: missing or empty \['negative'\]"):
        load_offline_pairs(tmp_path / "bad.jsonl")


def test_the_chance_check_compares_with_the_majority_class_rate_and_reports_auc():
    """Run 19's BCE stage: a constant RM on rows 62.6% wrong is 0.626 accurate, which the old check (against 0.5)
    let pass."""
    from cooper_openrlhf.lab.prepare import starting_rm_problem, verifier_quality

    labels = [True] * 374 + [False] * 626
    constant = verifier_quality(labels, [-0.3] * len(labels))  # pays everything the same, below 0.5
    assert constant["accuracy"] == pytest.approx(0.626) and constant["majority_rate"] == pytest.approx(0.626)
    assert constant["auc"] == pytest.approx(0.5)
    problem = starting_rm_problem(constant)
    assert "majority-class rate 0.626" in problem and "ROC-AUC 0.500" in problem
    ranked = verifier_quality(labels, [1.0] * 374 + [-1.0] * 626)
    assert (ranked["accuracy"], ranked["auc"]) == (1.0, 1.0) and starting_rm_problem(ranked) is None
    shifted = verifier_quality(labels, [-0.5] * 374 + [-1.0] * 626)  # ranks right, threshold off: AUC still 1
    assert shifted["auc"] == 1.0 and "majority-class" in starting_rm_problem(shifted)


def test_candidates_are_chosen_by_rank_of_climb():
    from cooper_openrlhf.lab.pair_stage import candidate_by_rank

    probes = [{"truth_reward": 0.8, "wrong_reward": 0.3, "universal_reward": u} for u in (0.4, 0.9, 0.6, 0.5, 0.45)]
    # climbs at accuracy 0.4: -0.1, 0.4, 0.1, 0.0, -0.05; by rank: 1, 2, 3, 4, 0 (median rank 2, between rank 1)
    assert [candidate_by_rank(probes, 0.4, c) for c in ("blindest", "between", "median")] == [1, 2, 3]
    assert candidate_by_rank(probes * 7, 0.4, "between") == 7  # 35: rank 8, the second copy of candidate 2
    with pytest.raises(ValueError, match="unknown candidate choice"):
        candidate_by_rank(probes, 0.4, "worst")
    args = lab_cli.parse_args(["--preset", "full", "--rm-choice", "median"])
    assert args.preset_obj.rm_pair_choice == "median"
    with pytest.raises(SystemExit, match="rm_pair_choice: 'blindest' -> 'median'"):
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            lab_cli.check_same_setup(Path(folder), PRESETS["full"])
            lab_cli.check_same_setup(Path(folder), args.preset_obj)


def test_negative_validity_rules_and_their_flag():
    from cooper_openrlhf.algo.negatives import NegativeConfig
    from cooper_openrlhf.algo.selection import negative_is_valid
    from cooper_openrlhf.cli.train_cooper import parse_args

    cases = [(True, False), (True, None), (True, True), (False, None)]  # (has an answer, proved equal?)
    assert [negative_is_valid("strict", *c) for c in cases] == [True, False, False, False]
    assert [negative_is_valid("official", *c) for c in cases] == [True, True, False, True]
    with pytest.raises(ValueError, match=r"unknown --cooper.negative_validity 'loose'; valid: \['strict', 'official'\]"):
        negative_is_valid("loose", True, False)
    with pytest.raises(ValueError, match="NegativeConfig.validity"):
        NegativeConfig(validity="loose")
    files = _files(Path("/lab"))
    argv = train_cooper_argv(PRESETS["full"], files, "cooper", 0)[3:]
    with pytest.raises(SystemExit):  # argparse: invalid choice, nothing run
        parse_args([*argv, "--cooper.negative_validity", "loose"])
