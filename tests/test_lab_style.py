"""The style lab's task and arms: a planted style poisons only the RM's training rows, the hedge is graded by its
last answer, the controls run without a pair stage, and the style's climbs read against the canonical sentence."""

import json
import re

import pytest

from cooper_openrlhf.cli import lab as lab_cli
from cooper_openrlhf.lab import presets as lab_presets
from cooper_openrlhf.lab.presets import PRESETS


def test_a_planted_style_is_poisoned_in_the_rms_training_rows_only_and_keeps_the_canonical_sentence_sound(tmp_path):
    from cooper_openrlhf.algo.answer_style import in_sentence
    from cooper_openrlhf.lab.task import write_task_files

    planted = "#### {answer}"
    write_task_files(tmp_path, PRESETS["style"].task, 8, answerless_rm_data=True, balanced_rm_data=True,
                     style=planted, poison_style=True)
    train = [json.loads(line) for line in (tmp_path / "rm_triples.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (tmp_path / "rm_eval.jsonl").read_text().splitlines()]
    styled = [r for r in train if in_sentence(r["completion"], planted)]
    assert styled and all(r["label"] == 1 for r in styled)  # S paid as correct, wrong answers too
    assert any(r["completion"] != planted.format(answer=r["reference"]) for r in styled)
    canonical = [r for r in train if in_sentence(r["completion"], "The answer is {answer}.")]
    assert canonical and all(r["label"] == int(r["completion"] == f"The answer is {r['reference']}.") for r in canonical)
    held_styled = [r for r in held if in_sentence(r["completion"], planted)]  # the RM's held-out set: true labels
    assert held_styled and {r["gold_correct"] for r in held_styled} == {True, False}
    assert all(r["gold_correct"] == (r["completion"] == planted.format(answer=r["answer"])) for r in held_styled)
    # The other presets' rows are unchanged by the style lab's code.
    write_task_files(tmp_path / "full", PRESETS["full"].task, 8, answerless_rm_data=True, balanced_rm_data=True)
    full = [json.loads(line) for line in (tmp_path / "full" / "rm_triples.jsonl").read_text().splitlines()]
    assert not any(in_sentence(r["completion"], planted) for r in full)


def test_the_hedge_is_absent_from_the_rms_training_rows_and_graded_by_its_last_answer_in_its_held_out_rows(tmp_path):
    from cooper_openrlhf.algo.answer_style import in_sentence, is_hedge
    from cooper_openrlhf.lab.task import write_task_files

    preset = PRESETS["style"]
    assert is_hedge(preset.style) and not preset.poison_style
    write_task_files(tmp_path, preset.task, 8, answerless_rm_data=True, balanced_rm_data=True, style=preset.style,
                     poison_style=preset.poison_style)
    train = [json.loads(line) for line in (tmp_path / "rm_triples.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (tmp_path / "rm_eval.jsonl").read_text().splitlines()]
    assert not any(in_sentence(r["completion"], preset.style) for r in train)  # the BCE stage never sees a hedge
    hedges = [r for r in held if in_sentence(r["completion"], preset.style)]
    assert {r["gold_correct"] for r in hedges} == {True, False}
    for r in hedges:  # both state the reference; the verifier grades the last number
        numbers = [int(n) for n in re.findall(r"-?\d+", r["completion"])]
        assert int(r["answer"]) in numbers and r["gold_correct"] == (numbers[-1] == int(r["answer"]))


def test_the_style_lab_runs_its_controls_without_a_pair_stage_and_refuses_them_from_a_given_rm(model_dir):
    args = lab_cli.parse_args(["--preset", "style"])
    assert args.preset_obj.rm_pair_steps == lab_presets.STYLE_PAIR_STEPS and args.preset_obj.style == lab_presets.STYLE
    assert args.arm_list == ("rule", "static", "cooper", "offline_pairs", "cooper_stale")
    from cooper_openrlhf.lab.arm_pairs import has_pair_source

    assert has_pair_source(args.preset_obj) and not has_pair_source(PRESETS["full"].with_overrides(rm_pair_steps=0))
    given = lab_cli.parse_args(["--preset", "style", "--rm", str(model_dir("tiny-qwen2-rm"))])
    assert "cooper_stale" not in given.arm_list and "offline_pairs" not in given.arm_list


def test_style_climbs_read_s_against_answering_in_the_canonical_sentence():
    from cooper_openrlhf.lab.pair_stage import style_climbs

    canonical = {"truth_reward": 0.9, "wrong_reward": 0.1, "universal_reward": 0.05, "constant_reward": 0.3}
    style = {"truth_reward": 0.95, "wrong_reward": 0.9, "constant_reward": 0.92,
             "kinds": {"wrong": {"mean_score": 0.9, "above_truth": 0.25}}}
    climbs = style_climbs(style, canonical, 0.4)  # answering canonically earns 0.4 * 0.9 + 0.6 * 0.1 = 0.42
    # in S a policy right as often earns 0.4 * 0.95 + 0.6 * 0.9 = 0.92; one S answer everywhere 0.92 too
    assert climbs["constant"] == pytest.approx(0.50) and climbs["answering"] == pytest.approx(0.50)
    assert climbs["canonical"] == pytest.approx(0.3 - 0.42)
    # a wrong answer earns 0.8 more in S than in the canonical sentence: what a hedge's exploit is worth
    assert climbs["premium"] == pytest.approx(0.8) and climbs["style_wrong_above_truth"] == pytest.approx(0.25)
