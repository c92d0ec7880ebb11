"""The annotation stage's shards: PROMPTS split into SHARDS files, one array task each, and their outputs merged.

A run folder OUT holds shards/prompts-KKK-of-NNN.jsonl (written once, the same files on every re-submission) and
annotated/part-KKK-of-NNN.jsonl (what `verifyrm annotate` writes for each, resumable per shard).
`cluster.stage_plans.plan_annotate` plans the tasks; `merge_annotations` joins the parts once every one finished.
The RM-training launcher reads the same folder with its own SHARDS, which must be the annotate run's: a small data
set makes a user lower SHARDS for annotate, and a different count names files that do not exist. `check_annotated`
tells that apart from shards still running before anything is submitted, and the merge names the same causes.
"""

import os
import re

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


_SHARD_NAME = re.compile(r"^prompts-\d{3}-of-(\d{3})\.jsonl$")


def split_counts(out: str) -> list[int]:
    """The shard counts an annotate folder was split into (its shards/prompts-KKK-of-NNN.jsonl names), sorted."""
    folder = os.path.join(out, "shards")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted({int(match[1]) for match in map(_SHARD_NAME.match, names) if match})


def unfinished_shards(out: str, shards: int) -> list[str]:
    """The output files of the shards whose `verifyrm annotate` has not written its summary (still queued, running,
    or stopped early)."""
    from cooper_openrlhf.rm.annotate import output_paths

    return [part for part in shard_paths(out, shards)[1] if not output_paths(part)["summary"].exists()]


def check_split(out: str, shards: int) -> None:
    """Raise when SHARDS cannot name this annotate folder's files: no split at all (not an annotate OUT), or a split
    into another count (the fix: SHARDS as annotate had it)."""
    counts = split_counts(out)
    if not counts:
        raise PreflightError(f"ANNOTATED={out}: no shards/prompts-KKK-of-NNN.jsonl in it: give the OUT folder of "
                             "verifyrm_annotate.sbatch (its check writes shards/ before submitting), or set DATA to a "
                             "labelled JSON Lines file")
    if shards not in counts:
        found = " or ".join(str(n) for n in counts)
        raise PreflightError(f"SHARDS={shards}: ANNOTATED={out} was split into {found} shards (shards/prompts-*-of-"
                             f"{counts[-1]:03d}.jsonl); set SHARDS={counts[-1]}, the value verifyrm_annotate.sbatch ran "
                             "with")


def check_annotated(out: str, shards: int) -> list[str]:
    """The RM-training launcher's check of ANNOTATED before it submits (`check_split`); returns a note when some
    shards have not finished yet: the job merges them at its start, so it must run after the annotate array."""
    check_split(out, shards)
    unfinished = unfinished_shards(out, shards)
    if not unfinished:
        return []
    return [f"ANNOTATED={out}: {len(unfinished)} of {shards} shards have not finished yet; the job merges them when "
            "it starts, so submit it after the annotate array ends (SBATCH_ARGS=--dependency=afterok:ANNOTATE_JOB)"]


def merge_annotations(out: str, shards: int, merged: str) -> int:
    """Concatenate the shards' kept rows into `merged` once every shard has finished; returns the row count. Fails
    naming the cause: a SHARDS that is not the annotate run's (`check_split`), or shards without a summary."""
    if not os.path.isdir(out):
        raise PreflightError(f"ANNOTATED={out}: folder does not exist")
    check_split(out, shards)
    _, part_files = shard_paths(out, shards)
    missing = unfinished_shards(out, shards)
    if missing:
        from cooper_openrlhf.rm.annotate import output_paths

        started = sum(output_paths(part)["progress"].exists() for part in missing)
        raise PreflightError(f"ANNOTATED={out}: {len(missing)} of {shards} shards have not finished (no summary "
                             f"beside {missing[0]}; {started} of them started): the annotate array is still queued or "
                             "running (squeue), or some of its tasks failed (their logs, verifyrm-annotate-*.log): "
                             "wait for it, or re-submit it with the same variables, it resumes where it stopped")
    rows = 0
    with open(merged, "w", encoding="utf-8") as target:
        for part in part_files:
            with open(part, encoding="utf-8") as source:
                for line in source:
                    if line.strip():
                        target.write(line if line.endswith("\n") else line + "\n")
                        rows += 1
    return rows
