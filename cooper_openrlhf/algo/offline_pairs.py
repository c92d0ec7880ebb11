"""Offline pairs: the RM update of a Cooper run fed from a file instead of the policy's rollouts (a control arm).

Why. A Cooper run's RM keeps training every step; part of what it gains may come from training longer
on pairs of any kind, not from pairs of the policy's current outputs. `--cooper.offline_pairs FILE` keeps every
other part of the Cooper step -- the RM's loss, learning rate, schedule and one update per step -- and replaces
only where the step's pairs come from: the file's, one group per step, fresh each step, written before the run
(the lab writes pairs of its pair stage's kind: the policy's answer sentence with the reference answer against a
slip of it, `lab/pair_stage.py`). The policy's rollouts, rewards and update are untouched.

File: JSON lines {"step", "question", "reference", "positive", "negative"}; the rows of one "step" value are one
update's pairs. The k-th RM update of a run (global step k) trains on the group at position k mod the number of
groups, in ascending "step" order, so a file with at least as many groups as the run has steps never repeats one.
"""

import json
from pathlib import Path

from cooper_openrlhf.algo.pairs import NO_POSITIVE, PairBatch

FROM_OFFLINE = "offline"  # PairBatch.negative_source of an offline pair
FIELDS = ("step", "question", "reference", "positive", "negative")


def load_offline_pairs(path: str | Path) -> list[PairBatch]:
    """The file's groups as PairBatches (every pair valid), in ascending step order; a clear error for a file
    that is missing, empty, or has a row without one of FIELDS or with an empty text."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--cooper.offline_pairs {path}: no such file")
    groups: dict[int, list[dict]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [f for f in FIELDS if f not in row or (f != "step" and not str(row[f]).strip())]
        if missing:
            raise ValueError(f"--cooper.offline_pairs {path}, line {number}: missing or empty {missing}")
        groups.setdefault(int(row["step"]), []).append(row)
    if not groups:
        raise ValueError(f"--cooper.offline_pairs {path}: no pairs")
    return [PairBatch([r["question"] for r in rows], [str(r["reference"]) for r in rows],
                      [r["positive"] for r in rows], [r["negative"] for r in rows], [True] * len(rows),
                      [NO_POSITIVE] * len(rows), [FROM_OFFLINE] * len(rows))
            for _, rows in sorted(groups.items())]


def offline_batch(groups: list[PairBatch], global_step: int) -> PairBatch:
    """The pairs of the RM update at `global_step` (module docstring)."""
    return groups[global_step % len(groups)]
