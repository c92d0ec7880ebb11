"""A run folder as a Cooper run leaves it, written for the report's tests (test_report.py, test_report_replay.py):
event files through OpenRLHF's own writer (torch's SummaryWriter) and the rollout log."""

import json
from pathlib import Path


def write_events(folder: Path, scalars: dict[str, list[tuple[int, float]]]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    for tag, points in scalars.items():
        for step, value in points:
            writer.add_scalar(tag, value, step)
    writer.close()


def write_rollouts(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

