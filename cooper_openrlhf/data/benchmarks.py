"""Loaders for math benchmark files (JSON Lines, or parquet for generic sets) into typed records.

Each benchmark has a row parser (dict -> record fields) picked by name from `BENCHMARKS`. A row
that is not valid JSON, lacks a field or has a field of the wrong type raises
`BenchmarkFormatError` naming the file, the 1-based line and the field; with `skip_invalid=True`
it is instead recorded in `LoadResult.skipped` as (line, reason) and logged. Blank lines carry no
row and are ignored.

Reference answers per benchmark:
  gsm8k          text after the last "####" of `answer`, thousands commas removed ("1,600" -> "1600")
  math500        `answer` as is
  svamp          `Answer` (a JSON number) rendered without ".0" for whole numbers; question = Body + " " + Question
  olympiadbench  the `final_answer` list joined with ", ", every "$" removed
  verifybench    `answer`; rows also carry `completion`, `gold_correct` (bool) and optional `answer_type`

`load_qa_file` reads any other question/answer set: JSON Lines or parquet, with the question and
answer under keys the caller names; the answer is a string or a number (rendered as for SVAMP).
"""

import logging
import re
from pathlib import Path
from typing import Callable

from cooper_openrlhf.data.records import LoadResult, MathProblem, VerifyExample
from cooper_openrlhf.data.rows import ROW_FILE_SUFFIXES, RowFormatError, iter_rows
from cooper_openrlhf.runtime.registry import Registry

logger = logging.getLogger(__name__)

_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3})")


class BenchmarkFormatError(ValueError):
    """A row that cannot be read; the message names file, line and field."""


class _RowError(ValueError):
    """Raised by row parsers; the loader adds file and line."""


def _string(row: dict, name: str) -> str:
    if name not in row:
        raise _RowError(f"field {name!r} is missing")
    value = row[name]
    if not isinstance(value, str):
        raise _RowError(f"field {name!r} must be a string, got {type(value).__name__}")
    return value


def _gsm8k(row: dict) -> dict:
    answer = _string(row, "answer")
    if "####" not in answer:
        raise _RowError("field 'answer' has no '####' final-answer marker")
    reference = _THOUSANDS_COMMA.sub("", answer.rsplit("####", 1)[1].strip())
    if not reference:
        raise _RowError("field 'answer' is empty after '####'")
    return {"question": _string(row, "question"), "reference": reference}


def _math500(row: dict) -> dict:
    return {"question": _string(row, "problem"), "reference": _string(row, "answer")}


def _svamp(row: dict) -> dict:
    answer = row.get("Answer")
    if "Answer" not in row:
        raise _RowError("field 'Answer' is missing")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        raise _RowError(f"field 'Answer' must be a number, got {type(answer).__name__}")
    reference = str(int(answer)) if float(answer).is_integer() else repr(float(answer))
    return {"question": _string(row, "Body").strip() + " " + _string(row, "Question").strip(), "reference": reference}


def _olympiadbench(row: dict) -> dict:
    answers = row.get("final_answer")
    if "final_answer" not in row:
        raise _RowError("field 'final_answer' is missing")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise _RowError("field 'final_answer' must be a non-empty list of strings")
    reference = ", ".join(answer.replace("$", "").strip() for answer in answers)
    return {"question": _string(row, "question"), "reference": reference}


def _verifybench(row: dict) -> dict:
    gold = row.get("gold_correct")
    if "gold_correct" not in row:
        raise _RowError("field 'gold_correct' is missing")
    if not isinstance(gold, bool):
        raise _RowError(f"field 'gold_correct' must be a boolean, got {type(gold).__name__}")
    answer_type = row.get("answer_type")
    if answer_type is not None and not isinstance(answer_type, str):
        raise _RowError(f"field 'answer_type' must be a string when present, got {type(answer_type).__name__}")
    return {
        "question": _string(row, "question"),
        "reference": _string(row, "answer"),
        "completion": _string(row, "completion"),
        "gold_correct": gold,
        "answer_type": answer_type,
    }


# name -> (row parser, record type)
BENCHMARKS: Registry[tuple[Callable[[dict], dict], type]] = Registry("benchmark", {
    "gsm8k": (_gsm8k, MathProblem),
    "math500": (_math500, MathProblem),
    "svamp": (_svamp, MathProblem),
    "olympiadbench": (_olympiadbench, MathProblem),
    "verifybench": (_verifybench, VerifyExample),
})
# What `cli.evaluate` and the cluster's eval stage read when no list is given: the paper's math benchmarks that
# have a reader here (the paper's fifth, Odyssey, has none).
DEFAULT_BENCHMARKS = "gsm8k,svamp,math500,olympiadbench"


def load_benchmark(name: str, path: str | Path, *, skip_invalid: bool = False) -> LoadResult:
    """Read benchmark `name` from the JSON Lines file `path`.

    Raises BenchmarkFormatError on the first bad row unless `skip_invalid`, in which case bad
    rows are listed in the result's `skipped` (and logged as warnings).
    """
    parse_row, record_type = BENCHMARKS[name]
    result = LoadResult()
    try:
        for line_number, place, row in iter_rows(path, skipped=result.skipped if skip_invalid else None):
            try:
                fields = parse_row(row)
            except _RowError as exc:
                if not skip_invalid:
                    raise BenchmarkFormatError(f"{place}: {exc}") from None
                logger.warning("skipping %s: %s", place, exc)
                result.skipped.append((line_number, str(exc)))
                continue
            result.records.append(record_type(**fields, source=name, index=line_number - 1))
    except RowFormatError as exc:
        raise BenchmarkFormatError(str(exc)) from None
    return result


QA_SUFFIXES = ROW_FILE_SUFFIXES


def _answer_text(row: dict, key: str) -> str:
    if key not in row or row[key] is None:
        raise _RowError(f"field {key!r} is missing")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _RowError(f"field {key!r} must be a string or a number, got {type(value).__name__}")
    if isinstance(value, (int, float)):
        value = str(int(value)) if float(value).is_integer() else repr(float(value))
    if not value.strip():
        raise _RowError(f"field {key!r} is empty (no reference answer)")
    return value.strip()


def load_qa_file(path: str | Path, question_key: str = "question", answer_key: str = "answer",
                 source: str | None = None) -> LoadResult:
    """Questions with reference answers from any JSON Lines (.jsonl/.json) or parquet file.

    Every row needs a non-empty string under `question_key` and a non-empty string or number under
    `answer_key`; the first row that lacks one raises BenchmarkFormatError naming file, line (row
    for parquet) and field. A file with no rows raises too: an evaluation set must not be empty.
    """
    path = Path(path)
    if path.suffix not in QA_SUFFIXES:
        raise BenchmarkFormatError(f"{path}: unsupported file type {path.suffix!r}; valid: {list(QA_SUFFIXES)}")
    result = LoadResult()
    try:
        rows = list(iter_rows(path))
    except RowFormatError as exc:
        raise BenchmarkFormatError(str(exc)) from None
    for number, place, row in rows:
        try:
            question = _string(row, question_key)
            if not question.strip():
                raise _RowError(f"field {question_key!r} is empty")
            reference = _answer_text(row, answer_key)
        except _RowError as exc:
            raise BenchmarkFormatError(f"{place}: {exc}") from None
        result.records.append(MathProblem(question, reference, source or path.stem, number - 1))
    if not result.records:
        raise BenchmarkFormatError(f"{path}: no questions in the file")
    return result
