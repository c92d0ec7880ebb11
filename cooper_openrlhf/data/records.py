"""Typed records produced by the data loaders."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MathProblem:
    """A question with its reference final answer.

    source: benchmark name ("gsm8k", "synthetic", ...); index: 0-based line index in its file
    (or position in a generated set), so a record can always be traced back to its row.
    """

    question: str
    reference: str
    source: str
    index: int


@dataclass(frozen=True)
class VerifyExample:
    """A VerifyBench-format row: is `completion` a correct answer to `question` given `reference`?

    gold_correct: the human/dataset label. answer_type: optional grouping key ("numeric", ...).
    """

    question: str
    reference: str
    completion: str
    gold_correct: bool
    answer_type: str | None
    source: str
    index: int


@dataclass
class LoadResult:
    """Records read from one file, plus the rows skipped with `skip_invalid=True`.

    skipped: (1-based line number, reason) for every row that was not turned into a record.
    """

    records: list = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
