"""Reading a Cooper run's own logs back from disk: its tensorboard scalars and its rollout log.

A run folder is whatever a training launch wrote into: OpenRLHF's logger puts tensorboard event files under
`--logger.tensorboard_dir/<run_name>`, Cooper's `--cooper.sample_log_dir` holds rollouts.jsonl (the trainer's
`append_jsonl`, ray/trainer.py). Both are found recursively under the folder, so any layout works. The GPU smoke
test's checks (cluster/run_checks.py) and the run reports (report/runs.py) read runs through these.

Scalars come back as {metric: [(step, value), ...]} sorted by step, with the metric named as the trainer
logs it: OpenRLHF's `train/` prefix is dropped (`train/cooper/rm_reward_mean` -> `cooper/rm_reward_mean`,
`train/timing/ppo_train` -> `timing/ppo_train`), `eval/...` keys stay as they are. When a step was written
more than once (a resumed run re-logs the steps after its checkpoint, maybe into a new `<run_name>` folder),
the newest write wins; tensorboard's own orphan purge is off because it works per file, not per run.
"""

import json
from collections import defaultdict
from pathlib import Path

EVENT_FILE_GLOB = "events.out.tfevents.*"
TRAIN_PREFIX = "train/"

Series = list[tuple[int, float]]  # (step, value), sorted by step, one value per step


def metric_name(tag: str) -> str:
    """Tensorboard tag -> the metric as the trainer logs it (`train/` dropped, `eval/` kept)."""
    return tag[len(TRAIN_PREFIX):] if tag.startswith(TRAIN_PREFIX) else tag


def merge_points(points: list[tuple[float, int, float]]) -> Series:
    """(wall_time, step, value) points of one metric -> one value per step, the newest write of a step winning."""
    newest: dict[int, tuple[float, float]] = {}
    for wall_time, step, value in points:
        if step not in newest or wall_time >= newest[step][0]:
            newest[step] = (wall_time, value)
    return [(step, newest[step][1]) for step in sorted(newest)]


def event_dirs(run_dir: Path) -> list[Path]:
    """Every folder under run_dir (itself included) holding tensorboard event files."""
    return sorted({path.parent for path in run_dir.rglob(EVENT_FILE_GLOB)})


def read_scalars(run_dir: Path) -> dict[str, Series]:
    """All scalars of the run's event files (module docstring for naming and merging)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points: dict[str, list[tuple[float, int, float]]] = defaultdict(list)
    for folder in event_dirs(run_dir):
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0}, purge_orphaned_data=False)
        events.Reload()
        for tag in events.Tags()["scalars"]:
            points[metric_name(tag)].extend((e.wall_time, e.step, e.value) for e in events.Scalars(tag))
    return {name: merge_points(values) for name, values in sorted(points.items())}


def iter_rollouts(path: Path):
    """The rows of a rollouts.jsonl (or heldout.jsonl), `step` / `verified` / `reward` typed (a held-out row's
    reward may be null: no RM scored it); a bad row fails naming file and line."""
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                reward = row["reward"]
                row.update(step=int(row["step"]), verified=bool(row["verified"]),
                           reward=None if reward is None else float(reward))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"{path}, line {line_number}: not a rollout row ({exc})") from None
            yield row
