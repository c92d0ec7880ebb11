"""VerifyRM recipe, pure parts: reading prompts and labelled rows, the split, chunk labelling, the summary, resume files."""

import json
from collections import Counter

import pytest

from cooper_openrlhf.data.records import MathProblem
from cooper_openrlhf.rm import annotate as ann
from cooper_openrlhf.rm.data import (
    RecipeDataError,
    load_for_scoring,
    load_labelled,
    load_prompts,
    require_both_classes,
    split_by_question,
)
from cooper_openrlhf.verify.judge import Judgement, JudgeVerdict
from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome


def write_jsonl(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------- prompts
def test_plain_prompts_without_a_reference_name_file_line_and_field(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": "1+1?", "reference": "2"}, "", {"question": "2+2?"}])
    with pytest.raises(RecipeDataError, match=r"p\.jsonl:3: field 'reference' is missing"):
        load_prompts(path)


def test_plain_prompts_with_an_empty_reference_fail(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": "1+1?", "reference": "  "}])
    with pytest.raises(RecipeDataError, match=r"p\.jsonl:1: field 'reference' is empty"):
        load_prompts(path)


def test_plain_prompts_load_in_order_with_their_line(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": "1+1?", "reference": "2"}, {"question": "3*3?", "reference": "9"}])
    problems = load_prompts(path, limit=1)
    assert problems == [MathProblem("1+1?", "2", str(path), 0)]


def test_benchmark_prompts_reuse_the_benchmark_loader(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "How many?", "answer": "2 + 2 = 4\n#### 1,004"}])
    assert [(p.question, p.reference, p.source) for p in load_prompts(path, "gsm8k")] == [("How many?", "1004", "gsm8k")]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "How many?", "answer": "no marker"}])
    with pytest.raises(RecipeDataError, match=r"bad\.jsonl:1: field 'answer' has no '####'"):
        load_prompts(bad, "gsm8k")


# ----------------------------------------------------------------------------------- labelled rows
ROW = {"question": "1+1?", "reference": "2", "completion": "\\boxed{2}", "label": 1}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"label": "yes"}, r":2: field 'label' must be 0, 1, true or false, got 'yes'"),
        ({"label": 0.5}, r":2: field 'label' must be 0, 1"),
        ({"completion": "   "}, r":2: field 'completion' is empty"),
        ({"completion": None}, r":2: field 'completion' must be a string, got NoneType"),
        ({"reference": ""}, r":2: field 'reference' is empty"),
    ],
)
def test_malformed_labelled_rows_name_file_line_and_field(tmp_path, change, message):
    path = write_jsonl(tmp_path / "d.jsonl", [ROW, {**ROW, **change}])
    with pytest.raises(RecipeDataError, match=r"d\.jsonl" + message):
        load_labelled(path)


def test_invalid_json_names_the_line(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [ROW, '{"question": '])
    with pytest.raises(RecipeDataError, match=r"d\.jsonl:2: invalid JSON"):
        load_labelled(path)


def test_booleans_are_labels_and_extra_fields_are_kept(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{**ROW, "label": False, "generator": "g"}])
    (triple,) = load_labelled(path)
    assert triple.label == 0 and triple.row["generator"] == "g" and triple.line == 1


def test_training_refuses_empty_and_single_class_sets(tmp_path):
    with pytest.raises(RecipeDataError, match="is empty: nothing to train on"):
        require_both_classes([], "training data")
    rows = load_labelled(write_jsonl(tmp_path / "d.jsonl", [ROW, ROW]))
    with pytest.raises(RecipeDataError, match="one class only: all 2 rows have label 1"):
        require_both_classes(rows, "training data")


def test_split_keeps_each_question_on_one_side_regardless_of_order(tmp_path):
    rows = [{**ROW, "question": f"q{i % 10}", "label": i % 2} for i in range(40)]
    triples = load_labelled(write_jsonl(tmp_path / "d.jsonl", rows))
    train, held_out = split_by_question(triples, 0.3, seed=1)
    assert {t.question for t in train}.isdisjoint({t.question for t in held_out})
    assert len({t.question for t in held_out}) == 3 and len(train) + len(held_out) == 40
    train_reversed, held_out_reversed = split_by_question(triples[::-1], 0.3, seed=1)
    assert {t.question for t in held_out_reversed} == {t.question for t in held_out}
    assert {t.question for t in split_by_question(triples, 0.3, seed=2)[1]} != {t.question for t in held_out}


def test_split_holds_out_at_least_one_question_and_needs_two(tmp_path):
    two = load_labelled(write_jsonl(tmp_path / "two.jsonl", [ROW, {**ROW, "question": "2+2?", "reference": "4"}]))
    train, held_out = split_by_question(two, 0.01)
    assert len(train) == len(held_out) == 1
    with pytest.raises(RecipeDataError, match="at least 2 distinct questions"):
        split_by_question(two[:1], 0.5)


def test_scoring_rows_allow_an_empty_completion_but_need_a_reference(tmp_path):
    rows = load_for_scoring(write_jsonl(tmp_path / "s.jsonl", [{"question": "q", "reference": "1", "completion": ""}]))
    assert rows[0].completion == "" and rows[0].where.endswith("s.jsonl:1")
    with pytest.raises(RecipeDataError, match=r"s2\.jsonl:1: field 'reference' is missing"):
        load_for_scoring(write_jsonl(tmp_path / "s2.jsonl", [{"question": "q", "completion": "c"}]))


# ----------------------------------------------------------------------------------- annotation logic
def _outcome(verdict):
    return VerifyOutcome(verdict, None, 0.0)


def test_label_chunk_keeps_agreement_only():
    problems = [MathProblem("q0", "1", "t", 0), MathProblem("q1", "2", "t", 1)]
    completions = ["a", "", "c", "d"]  # k = 2: q0 -> a, ""; q1 -> c, d
    rule = [_outcome(Verdict.CORRECT), _outcome(Verdict.NO_ANSWER), _outcome(Verdict.TIMEOUT)]
    judge = [Judgement(JudgeVerdict.YES, "Yes"), Judgement(JudgeVerdict.YES, "Yes"), Judgement(JudgeVerdict.NO, "No")]
    kept, rejected, counts = ann.label_chunk(problems, completions, 2, rule, judge, "gen")
    assert [(r["completion"], r["label"], r["question"], r["sample"]) for r in kept] == [("a", 1, "q0", 0)]
    assert [(r["completion"], r["reason"]) for r in rejected] == [("c", "rule_no_judge_yes"), ("d", "rule_undecided")]
    assert counts == Counter(generated=4, empty=1, kept=1, kept_correct=1, rule_yes_judge_no=0, rule_no_judge_yes=1,
                             rule_undecided=1, judge_undecided=0)


def test_summary_measures_the_rule_verifier_against_the_judge():
    counts = Counter({key: 0 for key in ann.COUNT_KEYS})
    counts.update(generated=12, empty=1, kept=7, kept_correct=3, rule_yes_judge_no=1, rule_no_judge_yes=2, judge_undecided=1)
    summary = ann.summarize({"g": counts})
    assert summary["agreement_rate"] == pytest.approx(7 / 10)
    assert summary["label_balance"] == {"correct": 3, "incorrect": 4, "correct_fraction": pytest.approx(3 / 7)}
    # tp = 3 (kept correct), fp = 1 (rule yes, judge no), fn = 2 (rule no, judge yes), tn = 4
    assert summary["rule_vs_judge"]["precision"] == pytest.approx(3 / 4)
    assert summary["rule_vs_judge"]["recall"] == pytest.approx(3 / 5)
    assert summary["disagreements"] == {"rule_yes_judge_no": 1, "rule_no_judge_yes": 2}


def test_chunk_seeds_depend_only_on_seed_generator_and_first_question():
    config = ann.AnnotateConfig(generators=("a", "b"), judge="j", chunk_size=3)
    chunks = ann.plan_chunks(7, config)
    assert [(c.generator_index, c.start, c.end) for c in chunks] == [(0, 0, 3), (0, 3, 6), (0, 6, 7), (1, 0, 3), (1, 3, 6), (1, 6, 7)]
    seeds = [ann.chunk_seed(0, c) for c in chunks]
    assert len(set(seeds)) == 6 and seeds == [ann.chunk_seed(0, c) for c in ann.plan_chunks(7, config)]
    assert ann.chunk_seed(1, chunks[0]) != seeds[0]


def _header(**settings):
    return {"kind": "header", "settings": settings, "prompts": {"count": 1, "sha256": "x"}}


def test_resume_truncates_rows_of_an_unrecorded_chunk_and_a_partial_progress_line(tmp_path):
    paths = ann.output_paths(tmp_path / "out.jsonl")
    header = _header(seed=0)
    assert ann._prepare_resume(paths, header) == {}
    kept_size = ann._append(paths["kept"], '{"row": 1}\n')
    chunk = {"kind": "chunk", "generator_index": 0, "start": 0, "end": 1, "sizes": {"kept": kept_size, "rejected": 0}, "counts": {}}
    ann._append(paths["progress"], json.dumps(chunk) + "\n")
    ann._append(paths["kept"], '{"row": 2, "cut sh')  # a chunk killed while writing
    ann._append(paths["progress"], '{"kind": "chu')  # and while recording
    done = ann._prepare_resume(paths, header)
    assert list(done) == [(0, 0)]
    assert paths["kept"].read_text() == '{"row": 1}\n'
    assert paths["progress"].read_text().splitlines()[-1] == json.dumps(chunk)


def test_resume_with_other_settings_is_refused(tmp_path):
    paths = ann.output_paths(tmp_path / "out.jsonl")
    ann._prepare_resume(paths, _header(seed=0))
    with pytest.raises(ann.AnnotateError, match=r"other settings \(differing: \['seed'\]\)"):
        ann._prepare_resume(paths, _header(seed=1))


def test_an_output_without_its_progress_file_is_not_overwritten(tmp_path):
    paths = ann.output_paths(tmp_path / "out.jsonl")
    paths["kept"].write_text('{"precious": 1}\n')
    with pytest.raises(ann.AnnotateError, match="exists but .*progress.jsonl does not"):
        ann._prepare_resume(paths, _header(seed=0))
    assert paths["kept"].read_text() == '{"precious": 1}\n'
