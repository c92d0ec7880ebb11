"""Benchmark specs and the generic question/answer loader: JSONL and parquet, bad rows named by file, line and field."""

import json

import pytest

from cooper_openrlhf.data.benchmarks import BenchmarkFormatError, load_qa_file
from cooper_openrlhf.eval.datasets import EVAL_BENCHMARKS, BenchmarkSpecError, load_problems, parse_benchmark_specs


def write_jsonl(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows), encoding="utf-8")
    return path


def test_generic_jsonl_with_custom_keys_and_numeric_answers(tmp_path):
    path = write_jsonl(tmp_path / "set.jsonl", [{"q": "1+1?", "a": 2}, "", {"q": "Half of 3?", "a": 1.5}, {"q": "x?", "a": " \\frac{1}{2} "}])
    records = load_qa_file(path, "q", "a", source="mine").records
    assert [(r.question, r.reference, r.index) for r in records] == [("1+1?", "2", 0), ("Half of 3?", "1.5", 2), ("x?", "\\frac{1}{2}", 3)]
    assert {r.source for r in records} == {"mine"}


def test_generic_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "set.parquet"
    pq.write_table(pa.table({"question": ["2+2?", "3+3?"], "answer": ["4", "6"]}), path)
    assert [(r.question, r.reference) for r in load_qa_file(path).records] == [("2+2?", "4"), ("3+3?", "6")]
    pq.write_table(pa.table({"question": ["2+2?", "3+3?"], "answer": ["4", None]}), path)
    with pytest.raises(BenchmarkFormatError, match=r"set\.parquet row 2: field 'answer' is missing"):
        load_qa_file(path)


@pytest.mark.parametrize(
    "bad_row, message",
    [
        ({"question": "q"}, r":2: field 'answer' is missing"),
        ({"question": "q", "answer": "  "}, r":2: field 'answer' is empty \(no reference answer\)"),
        ({"question": "q", "answer": ["1"]}, r":2: field 'answer' must be a string or a number, got list"),
        ({"answer": "1"}, r":2: field 'question' is missing"),
        ("{not json", r":2: invalid JSON"),
        ([1, 2], r":2: row must be a JSON object"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, bad_row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "ok?", "answer": "1"}, bad_row])
    with pytest.raises(BenchmarkFormatError, match=r"bad\.jsonl" + message):
        load_qa_file(path)


def test_empty_sets_and_unknown_types_are_refused(tmp_path):
    with pytest.raises(BenchmarkFormatError, match="no questions"):
        load_qa_file(write_jsonl(tmp_path / "empty.jsonl", [""]))
    (tmp_path / "x.csv").write_text("question,answer\n")
    with pytest.raises(BenchmarkFormatError, match="unsupported file type"):
        load_qa_file(tmp_path / "x.csv")


def test_specs_from_data_dir_and_name_equals_path(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [{"question": "q1", "answer": "work\n#### 1,200"}])
    write_jsonl(tmp_path / "svamp.jsonl", [{"Body": "b", "Question": "q", "Answer": 3.0}])
    custom = write_jsonl(tmp_path / "mine.jsonl", [{"problem": "p", "solution": "7"}])
    specs = parse_benchmark_specs("gsm8k, svamp, mine=" + str(custom), tmp_path, "problem", "solution")
    assert [(s.name, s.path.name, s.keys) for s in specs] == [
        ("gsm8k", "test.jsonl", None), ("svamp", "svamp.jsonl", None), ("mine", "mine.jsonl", ("problem", "solution"))]
    assert [load_problems(s)[0].reference for s in specs] == ["1200", "3", "7"]
    # A known name given a path keeps its public format when no keys are given.
    (spec,) = parse_benchmark_specs(f"gsm8k={tmp_path / 'gsm8k' / 'test.jsonl'}", None)
    assert spec.keys is None and load_problems(spec)[0].reference == "1200"


def test_bad_specs_say_what_is_valid(tmp_path):
    with pytest.raises(BenchmarkSpecError, match=r"unknown benchmark 'aime'; valid: \['gsm8k', 'math500'"):
        parse_benchmark_specs("gsm8k,aime", tmp_path)
    assert "verifybench" not in EVAL_BENCHMARKS
    with pytest.raises(BenchmarkSpecError, match="needs --data-dir"):
        parse_benchmark_specs("gsm8k", None)
    with pytest.raises(BenchmarkSpecError, match="none of .*gsm8k/test.jsonl"):
        parse_benchmark_specs("gsm8k", tmp_path)
    with pytest.raises(BenchmarkSpecError, match="does not exist"):
        parse_benchmark_specs(f"x={tmp_path / 'missing.jsonl'}", None)
    with pytest.raises(BenchmarkSpecError, match="unique"):
        write_jsonl(tmp_path / "a.jsonl", [{"question": "q", "answer": "1"}])
        parse_benchmark_specs(f"a={tmp_path / 'a.jsonl'},a={tmp_path / 'a.jsonl'}", None)


def test_limit_and_empty_reference_in_a_public_format(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [{"problem": f"p{i}", "answer": str(i)} for i in range(5)])
    (spec,) = parse_benchmark_specs(f"math500={path}", None)
    assert [p.reference for p in load_problems(spec, limit=2)] == ["0", "1"]
    write_jsonl(path, [{"problem": "p", "answer": "1"}, {"problem": "p", "answer": ""}])
    with pytest.raises(BenchmarkFormatError, match=r"m\.jsonl:2: the reference answer is empty"):
        load_problems(spec)
