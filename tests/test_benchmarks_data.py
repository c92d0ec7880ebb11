"""Benchmark loaders on the real files and on bad rows; the synthetic arithmetic generator."""

import json
from pathlib import Path

import pytest

from cooper_openrlhf.data.benchmarks import BENCHMARKS, BenchmarkFormatError, load_benchmark
from cooper_openrlhf.data.records import MathProblem, VerifyExample
from cooper_openrlhf.data.synthetic import make_arithmetic_problems

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_file(relative: str) -> Path:
    path = SHARED_DATA / relative
    if not path.is_file():
        pytest.skip(f"shared benchmark data not found: {path} (expected beside the checkout, as ../shared/data)")
    return path


@pytest.mark.shared_data
@pytest.mark.parametrize(
    "name, relative, rows",
    [
        ("gsm8k", "gsm8k/test.jsonl", 1319),
        ("gsm8k", "gsm8k/train.jsonl", 7473),
        ("math500", "math500/test.jsonl", 500),
        ("svamp", "svamp/test.jsonl", 1000),
        ("olympiadbench", "olympiadbench/test.jsonl", 675),
    ],
)
def test_every_row_of_the_real_files_loads(name, relative, rows):
    result = load_benchmark(name, shared_file(relative))
    assert len(result.records) == rows and result.skipped == []
    assert all(isinstance(r, MathProblem) and r.question and r.reference for r in result.records)
    assert [r.index for r in result.records] == list(range(rows))


@pytest.mark.shared_data
def test_real_references_are_normalised():
    gsm8k = load_benchmark("gsm8k", shared_file("gsm8k/test.jsonl")).records
    assert gsm8k[0].reference == "18"  # Janet's ducks
    assert all("," not in r.reference and "####" not in r.reference for r in gsm8k)
    svamp = load_benchmark("svamp", shared_file("svamp/test.jsonl")).records
    assert svamp[0].reference == "145"  # Answer 145.0
    assert svamp[0].question.startswith("There are 87 oranges") and svamp[0].question.endswith(
        "groups How big is each group of bananas?"
    )
    olympiad = load_benchmark("olympiadbench", shared_file("olympiadbench/test.jsonl")).records
    assert olympiad[1].reference == "\\frac{1}{2 n+2}"  # "$\frac{1}{2 n+2}$"
    assert all("$" not in r.reference for r in olympiad)
    math500 = load_benchmark("math500", shared_file("math500/test.jsonl")).records
    assert math500[0].reference == "\\left( 3, \\frac{\\pi}{2} \\right)"


def write_lines(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_small_rows_of_each_format(tmp_path):
    rows = {
        "gsm8k": {"question": "q", "answer": "3 + 4 = 7\n#### 1,234"},
        "math500": {"problem": "p", "answer": "\\frac{1}{2}"},
        "svamp": {"Body": "Tom has 5.", "Question": "Half?", "Answer": 2.5},
        "olympiadbench": {"question": "q", "final_answer": ["$69$,$84$"]},
    }
    expected = {"gsm8k": ("q", "1234"), "math500": ("p", "\\frac{1}{2}"), "svamp": ("Tom has 5. Half?", "2.5"),
                "olympiadbench": ("q", "69,84")}
    for name, row in rows.items():
        record = load_benchmark(name, write_lines(tmp_path, [json.dumps(row)])).records[0]
        assert (record.question, record.reference, record.source) == (*expected[name], name)


def test_verifybench_rows(tmp_path):
    path = write_lines(tmp_path, [
        json.dumps({"question": "q", "answer": "2", "completion": "\\boxed{2}", "gold_correct": True, "answer_type": "int"}),
        "",  # blank lines carry no row
        json.dumps({"question": "q", "answer": "2", "completion": "3", "gold_correct": False}),
    ])
    records = load_benchmark("verifybench", path).records
    assert records == [
        VerifyExample("q", "2", "\\boxed{2}", True, "int", "verifybench", 0),
        VerifyExample("q", "2", "3", False, None, "verifybench", 2),
    ]


BAD_ROWS = [
    ("gsm8k", {"question": "q"}, "field 'answer' is missing"),
    ("gsm8k", {"question": "q", "answer": "no marker"}, "'####'"),
    ("math500", {"problem": ["p"], "answer": "1"}, "field 'problem' must be a string, got list"),
    ("svamp", {"Body": "b", "Question": "q", "Answer": "3"}, "field 'Answer' must be a number"),
    ("svamp", {"Body": "b", "Question": "q", "Answer": True}, "field 'Answer' must be a number"),
    ("olympiadbench", {"question": "q", "final_answer": "3"}, "field 'final_answer' must be a non-empty list"),
    ("verifybench", {"question": "q", "answer": "1", "completion": "c", "gold_correct": "yes"}, "field 'gold_correct' must be a boolean"),
    ("verifybench", {"question": "q", "answer": "1", "completion": "c", "gold_correct": True, "answer_type": 3}, "field 'answer_type'"),
    ("verifybench", {"question": "q", "answer": 1, "completion": "c", "gold_correct": True}, "field 'answer' must be a string, got int"),
]


@pytest.mark.parametrize("name, row, message", BAD_ROWS)
def test_bad_row_names_file_line_and_field(tmp_path, name, row, message):
    good = {"gsm8k": {"question": "q", "answer": "#### 1"}, "math500": {"problem": "p", "answer": "1"},
            "svamp": {"Body": "b", "Question": "q", "Answer": 1.0}, "olympiadbench": {"question": "q", "final_answer": ["1"]},
            "verifybench": {"question": "q", "answer": "1", "completion": "c", "gold_correct": True}}[name]
    path = write_lines(tmp_path, [json.dumps(good), json.dumps(good), json.dumps(row)])
    with pytest.raises(BenchmarkFormatError) as error:
        load_benchmark(name, path)
    assert str(error.value).startswith(f"{path}:3: ") and message in str(error.value)


def test_skip_invalid_counts_every_skipped_row(tmp_path):
    good = json.dumps({"problem": "p", "answer": "1"})
    path = write_lines(tmp_path, [good, "{not json", json.dumps({"problem": "p"}), "[1, 2]", good])
    result = load_benchmark("math500", path, skip_invalid=True)
    assert [r.index for r in result.records] == [0, 4]
    assert [line for line, _ in result.skipped] == [2, 3, 4]
    assert result.skipped[0][1].startswith("invalid JSON")
    assert result.skipped[1][1] == "field 'answer' is missing"
    assert result.skipped[2][1] == "row must be a JSON object, got list"
    with pytest.raises(BenchmarkFormatError, match=":2: invalid JSON"):
        load_benchmark("math500", path)


def test_unknown_benchmark_lists_valid_names(tmp_path):
    with pytest.raises(ValueError, match="^unknown benchmark 'aime'; valid: \\['gsm8k', 'math500', 'svamp', 'olympiadbench', "
                                         "'verifybench'\\]$"):
        load_benchmark("aime", tmp_path / "x.jsonl")
    assert sorted(BENCHMARKS) == ["gsm8k", "math500", "olympiadbench", "svamp", "verifybench"]


def test_synthetic_problems_are_deterministic_and_correct():
    problems = make_arithmetic_problems(40, seed=7)
    assert problems == make_arithmetic_problems(40, seed=7)
    assert problems != make_arithmetic_problems(40, seed=8)
    assert [p.index for p in problems] == list(range(40)) and {p.source for p in problems} == {"synthetic"}
    for problem in problems:
        question = problem.question
        if question.startswith("What is "):
            a, op, b = question[len("What is ") : -1].split()
            value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        else:  # "X has A item. X buys B bags with C item in each bag. ..."
            words = question.split()
            value = int(words[2]) + int(words[6]) * int(words[9])
        assert problem.reference == str(value) and value >= 0
    kinds = {p.question.split()[3] if p.question.startswith("What") else "two_step" for p in problems[:4]}
    assert kinds == {"+", "-", "*", "two_step"}
