"""The VerifyRM recipe's files: prompts in, labelled triples out and back in, and the train/eval split.

Prompts (what `annotate` and `cluster.prompts` read): a JSON Lines file in one of `PROMPT_FORMATS` -- "plain" rows
are {"question": str, "reference": str}; "question-answer" rows {"question": str, "answer": a final answer}; the
others are the benchmark formats of `data/benchmarks.py` -- or the built-in synthetic arithmetic set. "auto" (the
default) tells the format from the first row's keys (`detect_prompt_format`), so the common datasets' files are
read as they are: GSM8K (question, answer with "#### 72"), MATH500 / DeepScaleR-style (problem, answer), SVAMP
(Body, Question, Answer), OlympiadBench (question, final_answer). Labelled triples (what `annotate` writes and `train` reads):
{"question", "reference", "completion", "label": 0/1, ...}; extra fields are kept as they are.

Every unreadable row raises `RecipeDataError` naming the file, the 1-based line and the field.
"""

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from cooper_openrlhf.runtime.registry import Registry
from cooper_openrlhf.data.benchmarks import BENCHMARKS, BenchmarkFormatError, load_benchmark, load_qa_file
from cooper_openrlhf.data.records import MathProblem
from cooper_openrlhf.data.rows import RowFormatError, iter_rows
from cooper_openrlhf.data.synthetic import make_arithmetic_problems
from cooper_openrlhf.verify.extract import normalize_answer

PROMPT_FORMATS = Registry("prompt format", ("auto", "plain", "question-answer",
                                           *sorted(name for name in BENCHMARKS if name != "verifybench")))
# What "auto" looks for in a file's first row, in order: (format, the keys it needs).
_FORMAT_KEYS = (
    ("plain", ("question", "reference")),
    ("svamp", ("Body", "Question", "Answer")),
    ("olympiadbench", ("question", "final_answer")),
    ("gsm8k", ("question", "answer")),  # only when the answer carries GSM8K's "####" marker
    ("question-answer", ("question", "answer")),
    ("math500", ("problem", "answer")),
)


class RecipeDataError(ValueError):
    """A recipe file that cannot be used; the message names file, line and field where there is one."""


@dataclass(frozen=True)
class LabelledTriple:
    """One training/eval row. label: 1 = the completion's final answer is correct. line: 1-based, in `path`."""

    question: str
    reference: str
    completion: str
    label: int
    row: dict
    path: str
    line: int


def _json_rows(path: str | Path):
    """(line number, dict) for every non-blank line; invalid JSON or a non-object raises naming the line."""
    try:
        for number, _, row in iter_rows(path):
            yield number, row
    except RowFormatError as exc:
        raise RecipeDataError(str(exc)) from None


def _text_field(row: dict, name: str, where: str, *, answer: bool = False) -> str:
    if name not in row:
        raise RecipeDataError(f"{where}: field {name!r} is missing")
    value = row[name]
    if not isinstance(value, str):
        raise RecipeDataError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
    empty = normalize_answer(value) is None if answer else not value.strip()
    if empty:
        raise RecipeDataError(f"{where}: field {name!r} is empty")
    return value


def detect_prompt_format(row: dict) -> str | None:
    """The prompt format whose keys `row` has (`_FORMAT_KEYS`), or None."""
    for fmt, keys in _FORMAT_KEYS:
        if all(key in row for key in keys):
            if fmt == "gsm8k" and "####" not in str(row["answer"]):
                continue
            return fmt
    return None


def _detect_file_format(path: str | Path) -> str:
    for line_number, row in _json_rows(path):
        fmt = detect_prompt_format(row)
        if fmt is None:
            known = "; ".join(f"{name}: {', '.join(keys)}" for name, keys in _FORMAT_KEYS)
            raise RecipeDataError(f"{path}:{line_number}: no known prompt keys (fields present: {sorted(row)}); a row "
                                  f"needs a question and its final answer, e.g. {{\"question\": \"What is 2 + 3?\", "
                                  f"\"reference\": \"5\"}}, or a common dataset's own keys ({known})")
        return fmt
    raise RecipeDataError(f"{path}: no prompts")


def load_prompts(path: str | Path, fmt: str = "auto", limit: int | None = None) -> list[MathProblem]:
    """Questions with reference answers from `path` in format `fmt` (first `limit` rows if given); "auto" reads the
    format from the first row's keys."""
    PROMPT_FORMATS.check(fmt)
    if fmt == "auto":
        fmt = _detect_file_format(path)
    problems: list[MathProblem] = []
    if fmt == "question-answer":
        try:
            problems = list(load_qa_file(path, "question", "answer", source=str(path)).records)
        except BenchmarkFormatError as exc:
            raise RecipeDataError(str(exc)) from exc
    elif fmt == "plain":
        for line_number, row in _json_rows(path):
            where = f"{path}:{line_number}"
            question = _text_field(row, "question", where)
            reference = _text_field(row, "reference", where, answer=True)
            problems.append(MathProblem(question=question, reference=reference, source=str(path), index=line_number - 1))
    else:
        try:
            records = load_benchmark(fmt, path).records
        except BenchmarkFormatError as exc:
            raise RecipeDataError(str(exc)) from exc
        for record in records:
            where = f"{path}:{record.index + 1}"
            if not record.question.strip():
                raise RecipeDataError(f"{where}: the question is empty")
            if normalize_answer(record.reference) is None:
                raise RecipeDataError(f"{where}: the reference answer is empty")
            problems.append(record)
    problems = problems[:limit] if limit is not None else problems
    if not problems:
        raise RecipeDataError(f"{path}: no prompts")
    return problems


def synthetic_prompts(n: int, seed: int = 0) -> list[MathProblem]:
    """`n` built-in synthetic arithmetic problems (`data/synthetic.py`), reproducible from `seed`."""
    if n < 1:
        raise RecipeDataError(f"need at least one synthetic problem, got {n}")
    return make_arithmetic_problems(n, seed=seed)


def load_labelled(path: str | Path) -> list[LabelledTriple]:
    """Labelled triples from an `annotate` output (or any file with the same four fields)."""
    triples = []
    for line_number, row in _json_rows(path):
        where = f"{path}:{line_number}"
        question = _text_field(row, "question", where)
        reference = _text_field(row, "reference", where, answer=True)
        completion = _text_field(row, "completion", where)
        if "label" not in row:
            raise RecipeDataError(f"{where}: field 'label' is missing")
        label = row["label"]
        if isinstance(label, bool):
            label = int(label)
        if label not in (0, 1) or isinstance(label, float):
            raise RecipeDataError(f"{where}: field 'label' must be 0, 1, true or false, got {row['label']!r}")
        triples.append(LabelledTriple(question, reference, completion, label, row, str(path), line_number))
    return triples


def label_counts(triples: list[LabelledTriple]) -> dict[int, int]:
    counts = Counter(t.label for t in triples)
    return {0: counts.get(0, 0), 1: counts.get(1, 0)}


def require_both_classes(triples: list[LabelledTriple], what: str) -> None:
    """Refuse an empty or one-class set: BCE on it teaches the classifier nothing but a constant."""
    if not triples:
        raise RecipeDataError(f"{what} is empty: nothing to train on")
    counts = label_counts(triples)
    if 0 in counts.values():
        only = 1 if counts[1] else 0
        raise RecipeDataError(
            f"{what} has one class only: all {len(triples)} rows have label {only}. A classifier needs both "
            f"correct (1) and incorrect (0) completions; annotate more questions or generators."
        )


def _question_rank(question: str, seed: int) -> bytes:
    return hashlib.sha256(f"{seed}\0{question}".encode()).digest()


def split_by_question(
    triples: list[LabelledTriple], eval_fraction: float, seed: int = 0
) -> tuple[list[LabelledTriple], list[LabelledTriple]]:
    """(train, eval): every completion of a question lands on the same side, so eval questions are unseen.

    Questions are ordered by a hash of (seed, question text) and the first round(eval_fraction * Q) of
    them -- at least one, at most Q - 1 -- are held out: the split does not depend on row order, and
    small sets still get an eval side. Rows keep their input order on both sides.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    questions = sorted({t.question for t in triples}, key=lambda q: _question_rank(q, seed))
    if len(questions) < 2:
        raise RecipeDataError(f"need at least 2 distinct questions to hold some out, got {len(questions)}")
    held_out_questions = set(questions[: min(len(questions) - 1, max(1, round(eval_fraction * len(questions))))])
    train = [t for t in triples if t.question not in held_out_questions]
    held_out = [t for t in triples if t.question in held_out_questions]
    return train, held_out


@dataclass(frozen=True)
class ScoringRow:
    """A (question, reference, completion) triple to score, with its whole row and where it came from."""

    question: str
    reference: str
    completion: str
    row: dict
    where: str  # "file:line"


def load_for_scoring(path: str | Path) -> list[ScoringRow]:
    """The rows of a file to score; extra fields are kept in `row`.

    The completion may be empty (an empty rollout is scored like any other); question and reference may not.
    """
    rows = []
    for line_number, row in _json_rows(path):
        where = f"{path}:{line_number}"
        question = _text_field(row, "question", where)
        reference = _text_field(row, "reference", where, answer=True)
        if not isinstance(row.get("completion"), str):
            raise RecipeDataError(f"{where}: field 'completion' is missing or not a string")
        rows.append(ScoringRow(question, reference, row["completion"], row, where))
    if not rows:
        raise RecipeDataError(f"{path}: no rows to score")
    return rows
