"""The lab's pieces without training: its CLI's checks, the arms' commands, the task files, what a lab folder
accepts on resume, and the lab's starting and last lines (how its runs are run: tests/test_lab_runs.py)."""

import json
import re
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from cooper_openrlhf.cli import lab as lab_cli
from cooper_openrlhf.lab import presets as lab_presets
from cooper_openrlhf.lab.arms import ARMS
from cooper_openrlhf.lab.presets import PRESETS
from cooper_openrlhf.lab.runner import LabFiles, train_cooper_argv, with_earlier_runs
from cooper_openrlhf.lab.task import TaskSpec, labelled_triples, problem_family, split, write_task_files


@pytest.mark.parametrize("argv, message", [
    (["--arms", "rule,hacked"], "unknown arm(s) ['hacked']"),
    (["--arms", "rule,rule"], "named twice"),
    (["--seeds", "0"], "--seeds must be >= 1, got 0"),
    (["--steps", "-1"], "--steps must be >= 1"),
    (["--rm", "/nonexistent/rm"], "--rm /nonexistent/rm: not a model folder"),
    (["--rm-lr", "0"], "--rm-lr must be > 0"),
    (["--actor-lr", "0"], "--actor-lr must be > 0"),
    (["--preset", "full", "--rm-candidate", "32"], "--rm-candidate must be in 0..31 (the full preset's 32 pair-stage seeds)"),
    (["--rm-candidate", "-1"], "--rm-candidate must be in 0..3 (the quick preset's 4 pair-stage seeds)"),
    (["--rm-candidate", "0", "--rm-pair-steps", "0"], "it has none with --rm-pair-steps 0"),
    (["--rm-pair-candidates", "0"], "--rm-pair-candidates must be >= 1, got 0"),
    (["--rm-pair-candidates", "12", "--rm-candidate", "12"], "--rm-candidate must be in 0..11 (--rm-pair-candidates 12 pair-stage seeds)"),
    (["--max-operand", "3"], "--max-operand 3 --heldout 32: held-out size must be in (0, 7)"),
])
def test_bad_lab_arguments_fail_at_once_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        lab_cli.parse_args(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_overrides_replace_the_presets_values_and_nothing_else():
    args = lab_cli.parse_args(["--preset", "full", "--arms", "static,cooper_rollout", "--seeds", "2", "--steps", "5"])
    full = PRESETS["full"]
    assert (args.preset_obj.arms, args.preset_obj.seeds, args.preset_obj.steps) == (("static", "cooper_rollout"), 2, 5)
    assert args.preset_obj.with_overrides(arms=full.arms, seeds=full.seeds, steps=full.steps) == full
    assert args.out.name == "lab-full"
    faster_rm = lab_cli.parse_args(["--preset", "full", "--rm-lr", "3e-4"]).preset_obj
    assert faster_rm.rm_lr == 3e-4 and faster_rm.with_overrides(rm_lr=full.rm_lr) == full
    assert "--cooper.rm_lr" in (argv := train_cooper_argv(faster_rm, _files(Path("/lab")), "cooper", 0)) and \
        argv[argv.index("--cooper.rm_lr") + 1] == "0.0003"
    wider_search = lab_cli.parse_args(["--preset", "full", "--rm-pair-candidates", "32", "--rm-candidate", "20"]).preset_obj
    assert (wider_search.rm_pair_candidates, wider_search.rm_pair_candidate) == (32, 20)
    assert wider_search.with_overrides(rm_pair_candidates=full.rm_pair_candidates) == replace(full, rm_pair_candidate=20)
    slower_policy = lab_cli.parse_args(["--preset", "full", "--actor-lr", "1e-4"]).preset_obj
    assert slower_policy.with_overrides(actor_lr=full.actor_lr) == full
    for arm in ("rule", "cooper"):  # every arm's policy, not only the RM arms'
        argv = train_cooper_argv(slower_policy, _files(Path("/lab")), arm, 0)
        assert argv[argv.index("--actor.adam.lr") + 1] == "0.0001"


def test_a_wider_task_is_the_presets_with_its_operands_and_held_out_size_and_a_rule_arm_needs_no_rm(tmp_path):
    wide = lab_cli.parse_args(["--preset", "full", "--arms", "rule", "--max-operand", "29", "--heldout", "128"]).preset_obj
    assert wide.task == replace(PRESETS["full"].task, max_operand=29, heldout=128)
    train, held_out = lab_cli.task_split(wide.task)
    assert (len(train), len(held_out)) == (len(problem_family(wide.task)) - 128, 128) and len(train) > 1000
    assert lab_cli.parse_args(["--preset", "full"]).preset_obj.task == PRESETS["full"].task  # no flag, no change
    # A lab of rule arms prepares no RM, and its runs' commands name none.
    argv = train_cooper_argv(wide, LabFiles(root=tmp_path, policy=tmp_path / "policy", rm=None), "rule", 0)
    assert argv[argv.index("--cooper.reward_source") + 1] == "rule" and "--reward.model_name_or_path" not in argv
    assert lab_cli.starting_lines({"policy": {}, "rm": {}}) == ["  starting RM: none (every arm is paid by the rule "
                                                               "verifier)"]


def _files(tmp_path: Path) -> LabFiles:
    return LabFiles(root=tmp_path, policy=tmp_path / "policy", rm=tmp_path / "verifyrm" / "best")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_arm_is_a_valid_train_cooper_run_and_arms_differ_only_in_their_reward_flags(preset, tmp_path):
    from cooper_openrlhf.cli.train_cooper import parse_args

    files, shared = _files(tmp_path), None
    for arm in ARMS:
        argv = train_cooper_argv(PRESETS[preset], files, arm, seed=0)
        files.offline_pairs(0).parent.mkdir(parents=True, exist_ok=True)
        files.offline_pairs(0).write_text("")  # --cooper.offline_pairs must name a file
        files.stale_pairs(0).write_text("")
        files.oracle_pairs(0).write_text("")
        args = parse_args(argv[3:])  # OpenRLHF's parser and validation, plus Cooper's checks
        reward_flag = "--cooper.reward_source" if arm == "rule" else "--reward.model_name_or_path"
        rest = [a.replace(f"{arm}_seed0", "RUN") for a in argv[3:argv.index(reward_flag)]]  # the arm's flags follow
        assert shared is None or rest == shared, arm  # same policy, data, seeds, budget, lengths, learning rates
        shared = rest
        assert args.remote_rm_trainable == ARMS[arm].trains_rm == (arm.startswith("cooper") or arm in ("offline_pairs", "oracle"))
        assert args.cooper.reward_source == ("rule" if arm == "rule" else "rm")
        assert args.eval.dataset == str(files.held_out)
        assert args.cooper.rm_eval_dataset == (None if arm == "rule" else str(files.rm_eval))
        assert args.data.max_samples == PRESETS[preset].steps * PRESETS[preset].prompts_per_step
        assert args.cooper.answerless_negatives == (arm == "cooper_rollout_answerless")
        assert args.cooper.negative_validity == ("official" if arm == "cooper_official" else "strict")
        assert args.cooper.offline_pairs == {"offline_pairs": str(files.offline_pairs(0)),
                                             "cooper_stale": str(files.stale_pairs(0)),
                                             "oracle": str(files.oracle_pairs(0))}.get(arm)
        if args.remote_rm_trainable:  # as shipped: the guard rolls back, updates anchored; but the paper's update
            assert args.cooper.rm_guard == ("watch" if arm == "cooper_unguarded" else "rollback")
            assert args.cooper.rm_anchor_weight == (0.0 if arm == "cooper_unguarded" else 1.0)
    assert set(ARMS) == {"rule", "static", "cooper", "cooper_rollout", "cooper_rollout_hardest",
                         "cooper_rollout_answerless", "cooper_official", "offline_pairs", "cooper_stale", "oracle",
                         "cooper_frozen_assistant", "cooper_unguarded", "cooper_anchored"}


def test_the_task_files_keep_the_held_out_split_out_of_training(tmp_path):
    spec = TaskSpec(family="digits", max_operand=9, heldout=20)
    family = problem_family(spec)
    assert len(family) == 64 + 36 and len({p.question for p in family}) == len(family)
    counts = write_task_files(tmp_path, spec, rl_prompts=150)
    rows = {name: [json.loads(line) for line in (tmp_path / name).read_text().splitlines()] for name in counts}
    assert counts == {name: len(r) for name, r in rows.items()} and counts["prompts.jsonl"] == 150
    held = {r["input"] for r in rows["held_out.jsonl"]}
    assert len(held) == 20 and not held & {r["input"] for r in rows["prompts.jsonl"]}
    assert not held & {r["question"] for r in rows["rm_triples.jsonl"]}
    assert {r["question"] for r in rows["rm_eval.jsonl"]} == held
    assert {"question", "answer", "completion", "gold_correct"} == set(rows["rm_eval.jsonl"][0])
    # A smaller RM evaluation set is a fixed sample of the whole one, in its order, both labels kept.
    sample = write_task_files(tmp_path / "sample", spec, rl_prompts=150, rm_eval_rows=40)
    assert sample["rm_eval.jsonl"] == 40 < counts["rm_eval.jsonl"]
    sampled = [json.loads(line) for line in (tmp_path / "sample" / "rm_eval.jsonl").read_text().splitlines()]
    whole = [json.dumps(r, sort_keys=True) for r in rows["rm_eval.jsonl"]]
    positions = [whole.index(json.dumps(r, sort_keys=True)) for r in sampled]
    assert positions == sorted(positions) and {r["gold_correct"] for r in sampled} == {True, False}
    write_task_files(tmp_path / "again", spec, rl_prompts=150, rm_eval_rows=40)  # every arm and seed: the same rows
    assert (tmp_path / "again" / "rm_eval.jsonl").read_text() == (tmp_path / "sample" / "rm_eval.jsonl").read_text()
    # 80 train problems cycled: every one appears before any appears a second time
    assert len({r["input"] for r in rows["prompts.jsonl"][:80]}) == 80
    train, _ = split(family, 20)
    assert [p.question for p in train] == [p.question for p in split(family, 20)[0]]  # the same for every arm and seed


def test_rm_triples_are_labelled_by_the_rule_verifier_not_by_construction():
    spec = TaskSpec(family="digits", max_operand=4)
    rows = labelled_triples(problem_family(spec)[:5], spec)
    assert {r["label"] for r in rows} == {0, 1}
    bare = [r for r in rows if r["completion"].lstrip("-").isdigit()]  # the "{answer}" template
    assert bare and all(r["label"] == int(r["completion"] == r["reference"]) for r in bare)


def test_answerless_rm_data_adds_each_right_completion_cut_before_its_answer_labelled_wrong(tmp_path):
    """The paper's VerifyRM data are sampled completions graded by math-verify: one that stops before its answer
    is labelled wrong. Without the setting every row answers (the older starting RM's data)."""
    from cooper_openrlhf.lab.task import COMPLETION_TEMPLATES
    from cooper_openrlhf.verify.rule import Verdict, verify_one

    spec = TaskSpec(family="digits", max_operand=9)
    problems = problem_family(spec)[:12]
    plain = labelled_triples(problems, spec, seed=1)
    assert len(plain) == 12 * 2 * len(COMPLETION_TEMPLATES)
    assert all(verify_one(r["reference"], r["completion"]).verdict != Verdict.NO_ANSWER for r in plain)

    rows = labelled_triples(problems, spec, seed=1, answerless=True)
    cut = [r for r in rows if verify_one(r["reference"], r["completion"]).verdict == Verdict.NO_ANSWER]
    assert [r for r in rows if r not in cut] == plain and 12 <= len(cut) <= 12 * (len(COMPLETION_TEMPLATES) - 1)
    assert all(r["label"] == 0 and r["completion"].strip() for r in cut)  # never empty: the recipe refuses that
    for r in cut:  # a right completion in some template, stopped before its answer
        rights = [t.format(question=r["question"], answer=r["reference"]) for t in COMPLETION_TEMPLATES]
        assert any(right.startswith(r["completion"]) for right in rights), r
    assert {"The", "The answer", "The answer is"} & {r["completion"] for r in cut}  # the policy's own sentence, cut

    files = write_task_files(tmp_path / "with", spec, rl_prompts=8, answerless_rm_data=True)
    assert files["rm_triples.jsonl"] > write_task_files(tmp_path / "without", spec, rl_prompts=8)["rm_triples.jsonl"]
    held = [json.loads(line) for line in (tmp_path / "with" / "rm_eval.jsonl").read_text().splitlines()]
    assert any(r["completion"].startswith("The answer") and r["completion"].split()[-1] in ("answer", "is")
               and r["gold_correct"] is False for r in held)  # the RM's held-out set has them too


def test_answerless_rm_data_is_a_shared_setting_and_a_folder_written_before_it_resumes_only_without_it(tmp_path):
    on = lab_cli.parse_args(["--preset", "full", "--rm-answerless-data"]).preset_obj
    off = lab_cli.parse_args(["--preset", "full", "--no-rm-answerless-data"]).preset_obj
    assert on.rm_answerless_data and not off.rm_answerless_data
    assert on.with_overrides(rm_answerless_data=False) == off  # nothing else moves, and no arm's flags
    assert lab_cli.parse_args(["--preset", "full"]).preset_obj == PRESETS["full"]
    old = {k: v for k, v in json.loads(json.dumps(asdict(off))).items()
           if k not in lab_cli.RESUMABLE_FIELDS and k != "rm_answerless_data"}
    (tmp_path / lab_cli.SETTINGS_FILE).write_text(json.dumps(old))
    lab_cli.check_same_setup(tmp_path, off)
    with pytest.raises(SystemExit, match=r"rm_answerless_data: False -> True"):
        lab_cli.check_same_setup(tmp_path, on)


def test_an_older_full_lab_folder_refuses_todays_starting_rm_and_resumes_with_the_two_flags_that_made_it(tmp_path):
    """A folder of the older starting RM (8 candidates, no cut-off rows) must refuse the new default, not mix two
    starting RMs, and resume with the flags that reproduce it (docs/lab/notebook.md)."""
    full = PRESETS["full"]
    assert (full.rm_answerless_data, full.rm_pair_candidates) == (True, 32)
    run16 = lab_cli.parse_args(["--preset", "full", "--no-rm-answerless-data", "--rm-pair-candidates", "8"]).preset_obj
    assert run16 == replace(full, rm_answerless_data=False, rm_pair_candidates=8)
    written = {k: v for k, v in json.loads(json.dumps(asdict(run16))).items() if k not in lab_cli.RESUMABLE_FIELDS}
    (tmp_path / lab_cli.SETTINGS_FILE).write_text(json.dumps(written))
    lab_cli.check_same_setup(tmp_path, run16)
    with pytest.raises(SystemExit, match=r"rm_answerless_data: False -> True"):
        lab_cli.check_same_setup(tmp_path, full)


def test_presets_are_sized_in_the_documented_order():
    assert PRESETS["quick"].arms == ("rule", "static", "cooper") and PRESETS["quick"].seeds == 1
    # the full preset runs the headline's arms: the paper's three, the official negative rule and the control
    assert PRESETS["full"].arms == ("rule", "static", "cooper", "cooper_official", "offline_pairs")
    assert PRESETS["full"].seeds >= 3
    # `make demo` runs the full preset's configuration, smaller: fewer arms and seeds, fewer RM candidates, no
    # probe of the offline continuation (whose RM no arm of the demo starts from), fewer evaluations on fewer rows,
    # a probe suite on fewer problems.
    full, quick = asdict(PRESETS["full"]), asdict(PRESETS["quick"])
    size = {"name", "arms", "seeds", "rm_pair_candidates", "offline_continuation", "budget_minutes", "eval_every",
            "rm_eval_rows", "parallel_runs", "rm_epochs", "probe_prompts"}
    assert {k: v for k, v in quick.items() if k not in size} == {k: v for k, v in full.items() if k not in size}
    assert quick["rm_pair_candidates"] < full["rm_pair_candidates"] and quick["budget_minutes"] <= 15
    assert 0 < quick["probe_prompts"] < full["probe_prompts"]
    assert quick["eval_every"] > full["eval_every"] and full["rm_eval_rows"] is None and quick["rm_eval_rows"] > 0
    assert (quick["parallel_runs"], full["parallel_runs"]) == (2, 1)  # the full preset's timings are one at a time
    assert quick["rm_epochs"] == full["rm_epochs"] - 1
    assert PRESETS["tiny"].arms == ("static", "rule") and PRESETS["tiny"].steps == 2
    assert lab_presets.PRESETS["smollm2"].policy == "smollm2-135m-instruct"


def test_the_warm_starts_rewrite_examples_are_coopers_prompt_answered_with_a_proven_wrong_answer():
    import random

    from cooper_openrlhf.algo.negatives import build_rewrite_messages
    from cooper_openrlhf.lab.warm_start import answer_text, rewrite_example
    from cooper_openrlhf.verify.rule import Verdict, verify_one

    rng = random.Random(0)
    for problem in problem_family(TaskSpec(family="digits", max_operand=4)):
        messages, reply = rewrite_example(problem, rng)
        assert messages == build_rewrite_messages(problem.question, answer_text(problem.reference), problem.reference)
        assert verify_one(problem.reference, reply).verdict == Verdict.INCORRECT  # a valid negative, by the rule
        assert int(reply.removeprefix("The answer is ").rstrip(".")) >= 0


def test_a_hedges_rewrite_swaps_its_two_numbers_so_the_negative_keeps_the_reference_and_grades_wrong():
    import random

    from cooper_openrlhf.algo.answer_style import in_sentence
    from cooper_openrlhf.lab.pair_stage import answer_pairs
    from cooper_openrlhf.lab.warm_start import answer_example, rewrite_example
    from cooper_openrlhf.verify.rule import Verdict, verify_one

    hedge, rng = lab_presets.STYLE, random.Random(0)
    problems = problem_family(TaskSpec(family="digits", max_operand=4))
    for problem in problems:
        _, answer = answer_example(problem, "", hedge)
        messages, reply = rewrite_example(problem, rng, "", hedge)
        assert in_sentence(answer, hedge) and in_sentence(reply, hedge) and answer in messages[-1]["content"]
        assert verify_one(problem.reference, answer).verdict == Verdict.CORRECT  # the reference last
        assert verify_one(problem.reference, reply).verdict == Verdict.INCORRECT  # a valid negative
        first, last = (re.findall(r"-?\d+", text) for text in (answer, reply))
        assert last == first[::-1] and first[0] != first[1]  # the same two numbers, swapped
    for pair in answer_pairs(problems, hedge, 8, rng):  # the pair stage's pairs in S are the same kind
        assert re.findall(r"-?\d+", pair.wrong) == re.findall(r"-?\d+", pair.right)[::-1]
        assert verify_one(pair.reference, pair.wrong).verdict == Verdict.INCORRECT


def test_a_lab_folder_refuses_other_settings_but_takes_more_seeds_and_arms(tmp_path):
    quick = PRESETS["quick"]
    lab_cli.check_same_setup(tmp_path, quick)
    lab_cli.check_same_setup(tmp_path, quick.with_overrides(seeds=3, arms=tuple(ARMS)))  # more runs of the same setup
    with pytest.raises(SystemExit, match=rf"other settings \(steps: {quick.steps} -> 12\).*Use another --out"):
        lab_cli.check_same_setup(tmp_path, quick.with_overrides(steps=12))


def test_a_starting_rm_at_chance_is_named_before_the_arms_run():
    from cooper_openrlhf.lab.prepare import starting_rm_problem, verifier_quality

    at_chance = verifier_quality([True, False] * 340, [0.1, -0.1] * 170 + [-0.1, 0.1] * 170)  # the smollm2 preset's first RM
    assert at_chance["accuracy"] == pytest.approx(0.5) and at_chance["auc"] == pytest.approx(0.5)
    assert "no verifier" in starting_rm_problem(at_chance) and "680 rows" in starting_rm_problem(at_chance)
    ranks = verifier_quality([True, False, True, False], [2.0, -1.0, 0.5, -0.2])
    assert ranks["auc"] == 1.0 and starting_rm_problem(ranks) is None
    assert starting_rm_problem({}) is None  # nothing recorded: nothing to say


def test_a_given_starting_rm_is_used_as_is_and_recorded_in_the_labs_settings(model_dir, tmp_path):
    from cooper_openrlhf.cli.lab import check_same_setup, parse_args
    from cooper_openrlhf.lab.prepare import prepare_rm

    rm = model_dir("tiny-qwen2-rm")
    preset = parse_args(["--preset", "tiny", "--rm", rm]).preset_obj
    assert preset.starting_rm == str(Path(rm).resolve())
    assert prepare_rm(preset, tmp_path / "no-data.jsonl", tmp_path / "verifyrm") == Path(preset.starting_rm)
    assert not (tmp_path / "verifyrm").exists()  # nothing trained
    check_same_setup(tmp_path, preset)
    with pytest.raises(SystemExit, match="starting_rm"):
        check_same_setup(tmp_path, PRESETS["tiny"])  # the recipe's RM would mix with the given one


def test_a_lab_folder_written_before_the_pair_stage_resumes_only_without_it(tmp_path):
    """Settings added later read as the value that reproduces an older folder: the BCE recipe's RM as it is."""
    old = {k: v for k, v in json.loads(json.dumps(asdict(PRESETS["quick"]))).items()
           if k not in lab_cli.RESUMABLE_FIELDS and not k.startswith("rm_pair_")}
    (tmp_path / lab_cli.SETTINGS_FILE).write_text(json.dumps(old))
    lab_cli.check_same_setup(tmp_path, lab_cli.parse_args(["--preset", "quick", "--rm-pair-steps", "0"]).preset_obj)
    with pytest.raises(SystemExit, match=r"rm_pair_steps: 0 -> 40"):
        lab_cli.check_same_setup(tmp_path, PRESETS["quick"])


def test_the_pair_stage_is_the_presets_and_never_applies_to_a_given_rm(model_dir, capsys):
    assert lab_cli.parse_args(["--preset", "full"]).preset_obj.rm_pair_steps == PRESETS["full"].rm_pair_steps > 0
    assert lab_cli.parse_args(["--preset", "full", "--rm-pair-steps", "0"]).preset_obj.rm_pair_steps == 0
    given = lab_cli.parse_args(["--preset", "full", "--rm", model_dir("tiny-qwen2-rm"), "--rm-pair-steps", "40"])
    assert given.preset_obj.rm_pair_steps == 0
    with pytest.raises(SystemExit):
        lab_cli.parse_args(["--rm-pair-steps", "-1"])
    assert "--rm-pair-steps must be >= 0, got -1" in capsys.readouterr().err


def test_a_folder_written_before_the_candidate_choice_resumes_and_another_choice_is_refused(tmp_path):
    """Run 10's folder (the pair stage, no rm_pair_candidate) still resumes; a named candidate would mix two RMs."""
    old = {k: v for k, v in json.loads(json.dumps(asdict(PRESETS["full"]))).items()
           if k not in lab_cli.RESUMABLE_FIELDS and k != "rm_pair_candidate"}
    (tmp_path / lab_cli.SETTINGS_FILE).write_text(json.dumps(old))
    lab_cli.check_same_setup(tmp_path, lab_cli.parse_args(["--preset", "full"]).preset_obj)
    with pytest.raises(SystemExit, match=r"rm_pair_candidate: None -> 3"):
        lab_cli.check_same_setup(tmp_path, lab_cli.parse_args(["--preset", "full", "--rm-candidate", "3"]).preset_obj)


def test_the_lab_runs_alarm_rule_f_and_refuses_to_resume_folders_that_ran_other_rules(tmp_path):
    """The lab passes its alarm rules to every run, by name (rule F, wrong_paid_more: docs/lab/notebook.md, "Rule F";
    the old letters are deprecated). A folder written with other rules (explicitly, or before the setting existed:
    A-D) logged other alarms, so resuming it would mix two in one report; one written with the letter F resumes."""
    from cooper_openrlhf.lab.runner import LabFiles, train_cooper_argv

    preset = PRESETS["full"]
    argv = train_cooper_argv(preset, LabFiles(tmp_path, tmp_path / "policy", tmp_path / "rm"), "static", 0)
    assert argv[argv.index("--cooper.hacking_rules") + 1] == preset.hacking_rules == "wrong_paid_more"
    settings = {k: v for k, v in json.loads(json.dumps(asdict(preset))).items() if k not in lab_cli.RESUMABLE_FIELDS}
    for same in (settings, {**settings, "hacking_rules": "F"}):  # same rules, by name or by letter: resumes
        (tmp_path / lab_cli.SETTINGS_FILE).write_text(json.dumps(same))
        lab_cli.check_same_setup(tmp_path, lab_cli.parse_args(["--preset", "full"]).preset_obj)
    for old in ({**settings, "hacking_rules": "ABCD"}, {k: v for k, v in settings.items() if k != "hacking_rules"}):
        (tmp_path / lab_cli.SETTINGS_FILE).write_text(json.dumps(old))
        with pytest.raises(SystemExit, match=r"hacking_rules: 'gap_growing,gap_high,heldout_falls,rm_blind' -> "
                                             r"'wrong_paid_more'"):
            lab_cli.check_same_setup(tmp_path, lab_cli.parse_args(["--preset", "full"]).preset_obj)


def test_require_answer_gates_every_arm_alike_and_a_folder_without_it_refuses_it(tmp_path):
    """The format gate is shared (the rule arm pays answerless text 0 anyway, so it changes only the RM arms' reward);
    a folder written before the setting existed ran ungated and resumes only without it."""
    from cooper_openrlhf.cli.train_cooper import parse_args

    gated = lab_cli.parse_args(["--preset", "full", "--require-answer"]).preset_obj
    assert gated.require_answer and gated.with_overrides(require_answer=False) == PRESETS["full"]
    files = _files(tmp_path)
    files.offline_pairs(0).parent.mkdir(parents=True)
    files.offline_pairs(0).write_text("")  # --cooper.offline_pairs must name a file
    files.stale_pairs(0).write_text("")
    files.oracle_pairs(0).write_text("")
    for arm in ARMS:
        assert parse_args(train_cooper_argv(gated, files, arm, 0)[3:]).cooper.require_answer
        assert not parse_args(train_cooper_argv(PRESETS["full"], files, arm, 0)[3:]).cooper.require_answer
    old = {k: v for k, v in json.loads(json.dumps(asdict(PRESETS["full"]))).items()
           if k not in lab_cli.RESUMABLE_FIELDS and k != "require_answer"}
    (tmp_path / lab_cli.SETTINGS_FILE).write_text(json.dumps(old))
    lab_cli.check_same_setup(tmp_path, lab_cli.parse_args(["--preset", "full"]).preset_obj)
    with pytest.raises(SystemExit, match=r"require_answer: False -> True"):
        lab_cli.check_same_setup(tmp_path, gated)


def test_a_named_candidate_is_the_starting_rm_and_shares_the_candidates_a_copied_folder_trained(tmp_path, monkeypatch):
    """The sweep copies a prepared folder (chosen: the blindest) and names another candidate: nothing is trained or
    probed again, the record says the choice was given, and the blindest is chosen again when asked."""
    from cooper_openrlhf.lab import pair_stage, prepare

    def no_work(*args, **kwargs):
        raise AssertionError("a cached candidate or probe was computed again")

    monkeypatch.setattr(pair_stage, "train_on_pairs", no_work)
    monkeypatch.setattr(prepare, "probe_preset_rm", no_work)
    folder = tmp_path / "pairs"
    folder.mkdir()
    probes = [{"version": prepare.PROBE_VERSION, "rm": str(folder / f"seed{seed}"), "require_answer": False,
               "truth_reward": 0.8, "wrong_reward": 0.3, "universal_reward": u, "verdict": f"v{u}"}
              for seed, u in enumerate((0.4, 0.9, 0.6))]
    for seed, probe in enumerate(probes):
        (folder / f"seed{seed}.json").write_text(json.dumps({"seed": seed, "last_step": {}, "probe": probe}))
    (folder / "chosen.json").write_text(json.dumps({"seed": 1, "policy_accuracy": 0.4, "bce_probe": {"verdict": "flat"},
                                                    "candidates": []}))  # as an older lab wrote it: no "choice"
    full = PRESETS["full"].with_overrides(rm_pair_candidates=3)

    rm, record = prepare.prepare_pair_stage(full, tmp_path / "bce", folder, 0.4)
    assert (rm, record["seed"]) == (folder / "seed1", 1)  # the cached blindest, as before

    rm, record = prepare.prepare_pair_stage(full.with_overrides(rm_pair_candidate=2), tmp_path / "bce", folder, 0.4)
    assert (rm, record["seed"], record["choice"]) == (folder / "seed2", 2, "given")
    assert record["bce_probe"] == {"verdict": "flat"}
    assert [c["climb"] for c in record["candidates"]] == pytest.approx([-0.1, 0.4, 0.1])
    assert json.loads((folder / "chosen.json").read_text())["seed"] == 2

    rm, record = prepare.prepare_pair_stage(full, tmp_path / "bce", folder, 0.4)
    assert (rm, record["choice"]) == (folder / "seed1", "blindest")

    # A probe of an older version (or of the other format gate) is made again; the candidate is not trained again.
    reprobed = []
    monkeypatch.setattr(prepare, "probe_preset_rm", lambda preset, rm: reprobed.append(rm) or {
        **probes[1], "rm": str(rm), "require_answer": preset.require_answer, "constant_reward": 0.95})
    (folder / "chosen.json").unlink()
    gated = full.with_overrides(require_answer=True)
    rm, record = prepare.prepare_pair_stage(gated, tmp_path / "bce", folder, 0.4)
    assert reprobed == [folder / f"seed{k}" for k in range(3)] + [tmp_path / "bce"]  # each candidate, then the BCE RM
    assert json.loads((folder / "seed0.json").read_text())["probe"]["require_answer"] is True


def test_a_wider_search_over_a_copied_folder_trains_only_the_new_candidates_and_chooses_among_all(tmp_path, monkeypatch):
    """More candidates asked of a folder (`--rm-pair-candidates`): those it holds are kept, only new seeds train."""
    from cooper_openrlhf.lab import pair_stage, prepare

    folder = tmp_path / "pairs"
    folder.mkdir()
    trained = []
    monkeypatch.setattr(pair_stage, "train_on_pairs", lambda rm, out, *a, seed, **k: trained.append(seed) or {})
    monkeypatch.setattr(prepare, "probe_preset_rm", lambda preset, rm: {
        "version": prepare.PROBE_VERSION, "rm": str(rm), "require_answer": False, "truth_reward": 0.8,
        "wrong_reward": 0.3, "universal_reward": 0.9 if str(rm).endswith("seed3") else 0.2, "verdict": str(rm)})
    preset = PRESETS["full"].with_overrides(rm_pair_candidates=2)
    rm, record = prepare.prepare_pair_stage(preset, tmp_path / "bce", folder, 0.4)
    assert (trained, record["seed"], len(record["candidates"])) == ([0, 1], 0, 2)

    rm, record = prepare.prepare_pair_stage(preset.with_overrides(rm_pair_candidates=4), tmp_path / "bce", folder, 0.4)
    assert trained == [0, 1, 2, 3]  # seeds 0 and 1 not trained again
    assert (rm, record["seed"], len(record["candidates"])) == (folder / "seed3", 3, 4)
    assert prepare.prepare_pair_stage(preset.with_overrides(rm_pair_candidates=4), tmp_path / "bce", folder, 0.4)[1] == record


def test_the_report_holds_the_runs_earlier_invocations_finished_in_the_folder(tmp_path):
    """`--arms rule` on a finished lab must not leave a report of the rule arm alone (its report covers every arm in the folder)."""
    files = LabFiles(tmp_path, tmp_path / "policy", tmp_path / "rm")
    assert with_earlier_runs(files, [("rule", 0)], ARMS) == [("rule", 0)]  # a new folder: nothing earlier
    for arm, seed, status in [("rule", 0, "done"), ("cooper", 1, "done"), ("static", 1, "failed"),
                              ("static", 0, "running"), ("static", 2, "done")]:
        run = files.run_dir(arm, seed)
        run.mkdir(parents=True)
        (run / "run_info.json").write_text(json.dumps({"arm": arm, "seed": seed, "status": status}))
    # The plan first, then the earlier finished runs seed by seed in the lab's arm order; the interrupted one is not
    # a result (it is started afresh when asked for), and a planned run is not listed twice.
    assert with_earlier_runs(files, [("static", 2), ("rule", 2)], ARMS) == [
        ("static", 2), ("rule", 2), ("rule", 0), ("static", 1), ("cooper", 1)]


def test_the_warm_start_seeds_script_records_each_warm_start_once_with_its_held_out_accuracy(tmp_path, model_dir, capsys):
    """scripts/warm_start_seeds.py: one row per (seed, clip, target), held-out scored beside the train split;
    a rerun trains nothing again. Target 0: every warm start stops at its first check."""
    import importlib.util

    model_dir("tiny-qwen2-policy")  # a missing model fails naming the install step
    path = Path(__file__).parents[1] / "scripts" / "warm_start_seeds.py"
    spec = importlib.util.spec_from_file_location("warm_start_seeds", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "seeds.jsonl"
    argv = [str(out), "--preset", "tiny", "--seeds", "0", "--clips", "none,1.0", "--target", "0"]
    script.main(argv)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["seed"], r["max_grad_norm"], r["target_accuracy"], r["steps"]) for r in rows] == [
        (0, None, 0.0, 50), (0, 1.0, 0.0, 50)]
    assert all(0 <= r["heldout_accuracy"] <= 1 and 0 <= r["train_accuracy"] <= 1 for r in rows)
    assert "| 0.0 | 1.0 | 0 | 50 |" in capsys.readouterr().out
    script.main(argv)
    assert out.read_text().count("\n") == 2  # nothing run twice
