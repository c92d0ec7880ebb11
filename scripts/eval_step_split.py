"""Where a lab run's step time goes: the seconds of its evaluation steps against its other steps, from run.log.

    python scripts/eval_step_split.py RUN_DIR... [--every 2]

A step's time is from OpenRLHF's "Starting experience making" line to its "Global step N" line (the step inside
`train_step`; the held-out evaluation after it is not counted). At every --eval.steps step the trainer also reads its
RM (probe suite, --cooper.rm_eval_dataset), which runs before the "Global step" line; runs made before that read was
timed (`timing/cooper_rm_read`) show it only this way. Timestamps only: no metric is read.
"""

import argparse
import re
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) ")


def step_seconds(log: Path) -> list[float]:
    """Seconds of each step, in order."""
    seconds, start = [], None
    for line in re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace")).replace("\r", "\n").splitlines():
        match = STAMP.search(line)
        if not match:
            continue
        at = datetime.strptime(match[1], "%m-%d %H:%M:%S")
        if "Starting experience making" in line:
            start = at
        elif "Global step " in line and start is not None:
            seconds.append((at - start).total_seconds())
            start = None
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--every", type=int, default=2, help="the runs' --eval.steps")
    args = parser.parse_args()
    for run in args.runs:
        steps = step_seconds(run / "run.log")
        at_eval = sum(s for i, s in enumerate(steps, 1) if i % args.every == 0)
        other = sum(steps) - at_eval
        print(f"{run.name}: {len(steps)} steps; evaluation steps {at_eval:.0f} s, other steps {other:.0f} s")


if __name__ == "__main__":
    main()
