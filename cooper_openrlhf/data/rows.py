"""Rows of the data files users hand the package (JSON Lines, a JSON list, parquet), each with its place.

One reader, so every tool names a bad row the same way: `path:line: reason` for JSON Lines (the line a
user opens in an editor), `path row N: reason` for a JSON list or parquet (1-based). Callers wrap
`RowFormatError` in their own error type where they have one; its message is already complete.
"""

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

logger = logging.getLogger(__name__)

ROW_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


class RowFormatError(ValueError):
    """A row that is not a JSON object (or a line that is not JSON); the message is `place: reason`."""


class FileRow(NamedTuple):
    number: int  # 1-based line (JSON Lines) or row (JSON list, parquet)
    place: str  # `path:line` or `path row N`, for messages
    data: dict


def row_place(path: str | Path, number: int, line_based: bool = True) -> str:
    """Where row `number` (1-based) of `path` is, as error messages spell it."""
    return f"{path}:{number}" if line_based else f"{path} row {number}"


def _json_list(path: Path, text: str) -> list | None:
    """The rows of a .json file that holds one JSON list, or None when it is JSON Lines after all."""
    if not text.lstrip().startswith("["):
        return None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RowFormatError(f"{path}: invalid JSON ({exc.msg}, line {exc.lineno})") from None
    return rows if isinstance(rows, list) else None


def iter_rows(path: str | Path, skipped: list[tuple[int, str]] | None = None) -> Iterator[FileRow]:
    """Every row of `path` with its number and place; blank JSON Lines lines are passed over.

    A line that is not JSON, or a row that is not a JSON object, raises RowFormatError naming its place;
    with `skipped` given it is appended there as (number, reason), logged, and left out instead.
    """
    path = Path(path)

    def bad(number: int, reason: str, line_based: bool = True) -> None:
        place = row_place(path, number, line_based)
        if skipped is None:
            raise RowFormatError(f"{place}: {reason}")
        logger.warning("skipping %s: %s", place, reason)
        skipped.append((number, reason))

    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for number, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield FileRow(number, row_place(path, number, line_based=False), row)
        return
    text = path.read_text(encoding="utf-8")
    listed = _json_list(path, text) if path.suffix == ".json" else None
    if listed is not None:
        for number, row in enumerate(listed, start=1):
            if isinstance(row, dict):
                yield FileRow(number, row_place(path, number, line_based=False), row)
            else:
                bad(number, f"row must be a JSON object, got {type(row).__name__}", line_based=False)
        return
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may sit in a string
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            bad(number, f"invalid JSON ({exc.msg})")
            continue
        if isinstance(row, dict):
            yield FileRow(number, row_place(path, number), row)
        else:
            bad(number, f"row must be a JSON object, got {type(row).__name__}")
