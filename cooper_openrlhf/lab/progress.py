"""Progress a person can follow while the lab works: one tqdm line per run (its step of the preset's, the last
step's reward, elapsed and estimated remaining time) and one per preparation stage.

Each line is read from what its process already writes, polled from a thread of the lab's own: a run's rollout log
(`samples/rollouts.jsonl`, one block of rows per finished step) and the BCE stage's `metrics.jsonl` (one "train"
row per optimizer step). No process is asked for anything it does not log anyway, so a line can lag its step by
POLL_S at most and never slows a run down. The warm start runs in the lab's own process and updates its line itself
(lab/warm_start.py), the pair stage's candidates theirs (lab/prepare.py).
"""

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

POLL_S = 1.0  # how often the files are read: a step takes seconds, so a line is never a step behind for long
# "step 12/80 |####    | [01:40<09:20], reward 0.53": the count first, tqdm's elapsed<remaining, then the last value
STEP_FORMAT = "{desc}: step {n_fmt}/{total_fmt} |{bar:16}| [{elapsed}<{remaining}]{postfix}"


class NewRows:
    """The JSON rows appended to a file since the last call ([] while it does not exist). A file that shrank (a run
    started afresh) is read again from its start."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def __call__(self) -> list[dict]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(0, 2)
                if handle.tell() < self.offset:
                    self.offset, self.partial = 0, b""
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:  # not a row (never written by the loggers read here); skipped, not fatal
                continue
        return rows


def step_bar(desc: str, total: int | None, position: int = 0, initial: int = 0, postfix: str | None = None) -> tqdm:
    """A line of STEP_FORMAT, printed at every update (mininterval 0: updates come once a step, not in floods)."""
    return tqdm(total=total, desc=desc, position=position, leave=True, mininterval=0, dynamic_ncols=True,
                bar_format=STEP_FORMAT if total else None, unit="step", initial=initial, postfix=postfix)


@contextmanager
def polling(update: Callable[[], None], poll_s: float = POLL_S) -> Iterator[None]:
    """Call `update` every `poll_s` seconds from a thread while the block runs, and once more after it."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(poll_s):
            update()

    thread = threading.Thread(target=loop, name="lab-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        update()


def step_rewards(rows: list[dict]) -> list[tuple[int, float]]:
    """(step, mean reward) per step of rollout-log rows, in the order the steps appear: what the RM paid, or where
    no RM pays (the rule arm, reward None) the share the verifier passed, which is that arm's reward."""
    by_step: dict[int, list[float]] = {}
    for row in rows:
        reward = row.get("reward")
        by_step.setdefault(row["step"], []).append(float(row["verified"] if reward is None else reward))
    return [(step, sum(values) / len(values)) for step, values in by_step.items()]


class RunsProgress:
    """One line per (arm, seed) of a lab's plan, updated from each run's rollout log as its steps finish.

    `run_dir(arm, seed)` is the run's folder; `done_before` the runs an earlier invocation finished (shown full).
    Call `finished(info)` with a run's run_info when it ends (lab/runner.py `run_arms`' on_done), and `update()` to
    read the logs (`polling` does it every POLL_S)."""

    def __init__(self, plan: list[tuple[str, int]], run_dir: Callable[[str, int], Path], steps: int,
                 done_before: set[tuple[str, int]] = frozenset()):
        self.plan, self.run_dir, self.steps = plan, run_dir, steps
        self.lock = threading.Lock()
        self.bars = {key: step_bar(f"{key[0]} seed {key[1]}", steps, position=i,
                                   initial=steps if key in done_before else 0,
                                   postfix="done earlier" if key in done_before else "waiting for a free core")
                     for i, key in enumerate(plan)}
        self.readers = {key: NewRows(run_dir(*key) / "samples" / "rollouts.jsonl") for key in plan}
        self.started: set[tuple[str, int]] = set()
        self.ended: dict[tuple[str, int], dict] = {}
        self.closed: set[tuple[str, int]] = set(done_before)  # lines that change no more
        self.last: dict[tuple[str, int], str] = {}

    def finished(self, info: dict) -> None:
        with self.lock:
            self.ended[(info["arm"], info["seed"])] = info
        self.update()

    def update(self) -> None:
        from cooper_openrlhf.lab.runner import read_info

        with self.lock:
            for key, bar in self.bars.items():
                if key in self.closed:
                    continue
                if key not in self.started and (key in self.ended or read_info(self.run_dir(*key)).get("status")
                                                == "running"):
                    self.started.add(key)
                    bar.reset(total=self.steps)  # elapsed and remaining count from the run's own start
                    bar.set_postfix_str("starting Ray, vLLM and DeepSpeed")
                if key not in self.started:
                    continue
                for _, reward in step_rewards(self.readers[key]()):
                    self.last[key] = f"reward {reward:.2f}"
                    bar.set_postfix_str(self.last[key], refresh=False)
                    bar.update(1)
                if key in self.ended:
                    info = self.ended[key]
                    ended = f"{info['status']} in {info.get('seconds') or 0:.0f} s"
                    bar.set_postfix_str(", ".join(filter(None, [self.last.get(key), ended])))
                    self.closed.add(key)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


BCE_TOTAL = re.compile(r"(\d+) optimizer steps")


def bce_stage_update(folder: Path, log: Path, bar: tqdm) -> Callable[[], None]:
    """An `update` for `polling` that moves `bar` with the BCE stage's optimizer steps (its metrics.jsonl under
    `folder`) and its last loss, the step count read from the stage's `log` once the stage has printed it."""
    reader = NewRows(folder / "metrics.jsonl")

    def update() -> None:
        if bar.total is None and log.is_file():
            found = BCE_TOTAL.search(log.read_text(encoding="utf-8", errors="replace"))
            if found:
                bar.total = int(found.group(1))
                bar.bar_format = STEP_FORMAT
        for row in reader():
            if row.get("kind") == "train":
                bar.set_postfix_str(f"loss {row['loss']:.3f}", refresh=False)
                bar.update(row["step"] - bar.n)
            elif row.get("kind") == "eval" and "accuracy" in row:
                bar.set_postfix_str(f"epoch {row.get('epoch', 0) + 1}: held-out accuracy {row['accuracy']:.3f}",
                                    refresh=False)
                bar.refresh()

    return update
