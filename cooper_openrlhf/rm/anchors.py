"""The RM's anchors: fixed labelled completions that RM health (`core/rm_health.py`) scores after every update.

Two parts, each a list of `rm.probes.Probe` (form, question, reference, completion, correct):
- **Labelled rows** (form "labelled"): a slice of held-out labelled triples. By default the VerifyRM recipe's own
  held-out split, which its BCE training never trained on: `verifyrm train --out DIR` writes DIR/eval_split.jsonl
  beside its export DIR/best, and the lab's pair-stage candidates sit at DIR/pairs/seed<k>, so the file is looked
  for in the RM's folder, then its parent, then its grandparent (`default_anchor_file`). A user who brings their
  own RM passes a file of rows kept out of that RM's training (`--cooper.rm_anchors FILE`, the service's
  `--rm-anchors FILE`): labelled triples {question, reference, completion, label 0/1} or VerifyBench rows
  {question, answer, completion, gold_correct}. `split_anchor_rows` keeps `rows` of them, balanced by label and
  chosen whole questions at a time by a seeded hash (not by row order), for health; the rest, other questions,
  may feed anchored updates (`rm/pairwise_update.py`, `--cooper.rm_anchor_weight`), so that the rows health reads
  are never trained on.
- **The probe suite** (`rm/probes.py`) on a few problems with an integer reference: canonical right and wrong
  answers and every attack form, labelled by the rule verifier.
With neither a file nor problems there are no anchors and the transports say the guard is off.
"""

import hashlib
import json
import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from cooper_openrlhf.rm.probes import Probe, build_probes, integer_problems

LABELLED = "labelled"  # the form of a labelled row among the anchors
ANCHOR_FILE = "eval_split.jsonl"  # the VerifyRM recipe's held-out split (rm/bce_train.py)
# The anchored update's BCE weight where an RM trains, by default, on both transports. Chosen by the RM guard pilot's
# pre-registered rule (docs/lab/rm_guard_pilot/plan.md; its reading in docs/cooper_step.md): no more degenerate RMs,
# right - exploit within its margin, ordinary wrong answers paid less, within its time bound. 0 is the paper's update.
ANCHOR_WEIGHT = 1.0


def default_anchor_file(rm_path: str | Path | None) -> Path | None:
    """The VerifyRM recipe's held-out split of `rm_path` (module docstring), or None."""
    if not rm_path:
        return None
    folder = Path(rm_path)
    for place in (folder, folder.parent, folder.parent.parent):
        if (place / ANCHOR_FILE).is_file():
            return place / ANCHOR_FILE
    return None


def load_anchor_rows(path: str | Path) -> list[Probe]:
    """The labelled rows of a file (labelled triples or VerifyBench rows, told apart per row); a ValueError names
    the file and line of a row that is neither."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                reference, label = (row["reference"], row["label"]) if "label" in row else \
                    (row["answer"], row["gold_correct"])
                if label not in (0, 1, True, False) or not isinstance(row["question"], str) \
                        or not isinstance(row["completion"], str):
                    raise ValueError(f"label {label!r}")
                rows.append(Probe(LABELLED, row["question"], str(reference), row["completion"], bool(label)))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a labelled row (question, reference, completion, label 0/1; "
                                 f"or question, answer, completion, gold_correct): {exc}") from None
    return rows


def _rank(question: str, seed: int) -> bytes:
    return hashlib.sha256(f"anchors\0{seed}\0{question}".encode()).digest()


def split_anchor_rows(rows: Sequence[Probe], count: int, seed: int = 0) -> tuple[list[Probe], list[Probe]]:
    """(health rows, the others): about `count` rows, as balanced between right and wrong as the file allows, taken
    whole questions at a time in a seeded hash order (the last question taken may bring a few rows more), so no
    question is both read by health and trained on. Input order is kept on both sides."""
    by_question: dict[str, list[Probe]] = defaultdict(list)
    for row in rows:
        by_question[row.question].append(row)
    want = {True: (count + 1) // 2, False: count // 2}
    available = {label: sum(r.correct == label for r in rows) for label in (True, False)}
    for label in (True, False):  # a label the file has too few of leaves its share to the other
        spare = max(0, want[label] - available[label])
        want[label] -= spare
        want[not label] += spare
    taken, chosen = {True: 0, False: 0}, set()
    for question in sorted(by_question, key=lambda q: _rank(q, seed)):
        if taken[True] >= want[True] and taken[False] >= want[False]:
            break
        group = by_question[question]
        need = [label for label in (True, False) if taken[label] < want[label]]
        if not any(r.correct in need for r in group):
            continue
        chosen.add(question)
        for r in group:
            taken[r.correct] += 1
    health = [r for r in rows if r.question in chosen]
    return health, [r for r in rows if r.question not in chosen]


def build_anchors(rows: Sequence[Probe], problems: Sequence, probe_problems: int) -> list[Probe]:
    """The anchor set: the labelled health rows, then the probe suite on the first `probe_problems` problems with
    an integer reference (none when 0 or none has one; the verifier labels them, so call it where math-verify's
    deadline works: the main thread)."""
    anchors = list(rows)
    if probe_problems > 0 and integer_problems(problems, 1):
        anchors += build_probes(problems, probe_problems)[0]
    return anchors


def describe(anchors: Sequence[Probe]) -> str:
    """"N anchors: L labelled (R right, W wrong), P probes over Q problems" for the start-up log."""
    labelled = [a for a in anchors if a.form == LABELLED]
    probes = [a for a in anchors if a.form != LABELLED]
    right = sum(a.correct for a in labelled)
    return (f"{len(anchors)} anchors: {len(labelled)} labelled ({right} right, {len(labelled) - right} wrong), "
            f"{len(probes)} probes over {len({a.question for a in probes})} problems")


def anchor_batch(rows: Sequence[Probe], size: int, step: int, seed: int = 0) -> list[Probe]:
    """The labelled rows an anchored update trains on at `step`: `size` of them drawn without replacement from a
    generator seeded by (seed, step), in input order (all of them when there are fewer)."""
    if size >= len(rows):
        return list(rows)
    picked = set(random.Random(f"anchors {seed} {step}").sample(range(len(rows)), size))
    return [row for i, row in enumerate(rows) if i in picked]


def anchor_sets(rm_path, anchors_file: str | None, rows: int, problems: Sequence, probe_problems: int,
                seed: int = 0) -> tuple[list[Probe], list[Probe], str]:
    """(health anchors, rows anchored updates may train on, where they came from) for an RM: the labelled rows of
    `anchors_file`, else of the recipe's held-out split beside the RM (`default_anchor_file`), split by
    `split_anchor_rows`; then the probe suite on `problems`. The third item says which file (or none) for the log."""
    path = anchors_file or default_anchor_file(rm_path)
    health_rows, train_rows = split_anchor_rows(load_anchor_rows(path), rows, seed) if path and rows > 0 else ([], [])
    if path and rows <= 0:
        train_rows = load_anchor_rows(path)
    anchors = build_anchors(health_rows, problems, probe_problems)
    source = f"labelled rows from {path}" if path else "no labelled rows (no --*anchors file, no eval_split.jsonl " \
                                                        "beside the RM)"
    return anchors, train_rows, source
