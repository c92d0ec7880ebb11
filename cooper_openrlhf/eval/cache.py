"""Per-benchmark generation cache: JSON Lines appended as questions finish, so a killed run resumes.

The first line is a header holding the settings that decide the generations (model, protocol,
sampling, prompt instruction); every later line is one question's completions:
``{"index": row index, "question": ..., "reference": ..., "completions": [...]}``.

Reopening checks the header against the current settings (a different model or temperature must
not silently mix into the scores) and reads back every complete line. A run killed mid-write
leaves a cut-off last line: it is dropped and the file truncated to the last complete line, so
the next append starts clean. Lines are flushed and fsynced per batch of questions.
"""

import json
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

HEADER_KIND = "cooper_openrlhf.eval.generations/v1"


class CacheMismatchError(RuntimeError):
    """The cache on disk was made with other settings."""


class GenerationCache:
    """Completions of one benchmark, keyed by question index. Use as a context manager or call close()."""

    def __init__(self, path: str | Path, settings: dict):
        self.path = Path(path)
        self.settings = json.loads(json.dumps(settings))  # normalised as it is stored (tuples -> lists)
        self.completions: dict[int, list[str]] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size > 0:
            self._read_existing()
        else:
            with open(self.path, "w", encoding="utf-8") as handle:
                handle.write(json.dumps({"kind": HEADER_KIND, "settings": self.settings}) + "\n")
        self._handle = open(self.path, "a", encoding="utf-8")

    def _read_existing(self) -> None:
        good_bytes = 0
        with open(self.path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    if not raw.endswith(b"\n"):
                        raise ValueError("line cut off")
                    row = json.loads(raw)
                except ValueError:
                    logger.warning("%s:%d: dropping an incomplete line (a killed run) and what follows", self.path, number)
                    break
                if number == 1:
                    self._check_header(row)
                else:
                    self.completions[int(row["index"])] = list(row["completions"])
                good_bytes += len(raw)
        if good_bytes < self.path.stat().st_size:
            os.truncate(self.path, good_bytes)
        if good_bytes == 0:  # not even a header survived
            with open(self.path, "w", encoding="utf-8") as handle:
                handle.write(json.dumps({"kind": HEADER_KIND, "settings": self.settings}) + "\n")

    def _check_header(self, row: dict) -> None:
        if not isinstance(row, dict) or row.get("kind") != HEADER_KIND:
            raise CacheMismatchError(f"{self.path} is not a generation cache of this tool; move it away or use another --out")
        stored = row.get("settings", {})
        changed = sorted(key for key in set(stored) | set(self.settings) if stored.get(key) != self.settings.get(key))
        if changed:
            details = ", ".join(f"{key}: {stored.get(key)!r} -> {self.settings.get(key)!r}" for key in changed)
            raise CacheMismatchError(
                f"{self.path} holds generations made with other settings ({details}); use another --out or delete the file"
            )

    def append(self, rows: list[dict]) -> None:
        """Store finished questions: dicts with index, question, reference, completions."""
        for row in rows:
            self._handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            self.completions[int(row["index"])] = list(row["completions"])
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> "GenerationCache":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def read_generations(path: str | Path) -> tuple[dict, list[dict]]:
    """(settings, rows) of a cache file, for scripts that regrade cached generations; skips a cut-off last line."""
    rows, settings = [], {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                row = json.loads(line)
            except ValueError:
                break
            if number == 1:
                settings = row.get("settings", {})
            else:
                rows.append(row)
    return settings, rows
