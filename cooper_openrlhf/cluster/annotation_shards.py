"""The annotation stage's shards: PROMPTS split into SHARDS files, one array task each, and their outputs merged.

A run folder OUT holds shards/prompts-KKK-of-NNN.jsonl (written once, the same files on every re-submission) and
annotated/part-KKK-of-NNN.jsonl (what `verifyrm annotate` writes for each, resumable per shard).
`cluster.stage_plans.plan_annotate` plans the tasks; `merge_annotations` joins the parts once every one finished.
"""

import os

from cooper_openrlhf.cluster.checks import PreflightError


def shard_bounds(count: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous, balanced [start, end) ranges: the first count % shards shards get one more row."""
    size, extra = divmod(count, shards)
    bounds, start = [], 0
    for k in range(shards):
        end = start + size + (1 if k < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def shard_paths(out: str, shards: int) -> tuple[list[str], list[str]]:
    """(prompt shard files, annotation output files) of an annotate run folder."""
    return ([os.path.join(out, "shards", f"prompts-{k:03d}-of-{shards:03d}.jsonl") for k in range(shards)],
            [os.path.join(out, "annotated", f"part-{k:03d}-of-{shards:03d}.jsonl") for k in range(shards)])


def merge_annotations(out: str, shards: int, merged: str) -> int:
    """Concatenate the shards' kept rows into `merged` once every shard has finished; returns the row count."""
    _, part_files = shard_paths(out, shards)
    from cooper_openrlhf.rm.annotate import output_paths

    missing = [p for p in part_files if not output_paths(p)["summary"].exists()]
    if missing:
        raise PreflightError(f"ANNOTATED={out}: {len(missing)} of {shards} shards have not finished (no summary: "
                             f"{missing[0]} ...); re-submit the annotate array, it resumes where it stopped")
    rows = 0
    with open(merged, "w", encoding="utf-8") as target:
        for part in part_files:
            with open(part, encoding="utf-8") as source:
                for line in source:
                    if line.strip():
                        target.write(line if line.endswith("\n") else line + "\n")
                        rows += 1
    return rows
