"""How many intra-op threads a CPU forward of a given size should use, learnt from the forwards themselves.

On a small CPU a forward of a few rows runs faster on one thread than on all of them: waking the OpenMP team costs
more than the work it shares (with the passive wait policy `cli.serve` sets, every forward pays that wake-up). A
large batch runs faster on all. Where the crossover lies depends on the model and the machine (measured with
`benchmarks/rm_forward_threads.py`: the tiny Qwen2 RM is faster on one thread up to about 32 rows, the MiniLM
VerifyRM only up to about 8), so no fixed threshold is right for both: `ThreadChoice` measures it. Per bucket of
rows (powers of two) it tries each thread count on the bucket's first batches, then runs the one with the fewer
seconds per row and tries the other again now and then, since the machine's load moves the crossover.

The count is torch's per-thread OpenMP setting: `torch.set_num_threads` changes the calling thread's count (and the
default a thread that has not run torch yet starts from), so `ThreadChoice.running` puts the previous count back
after each forward, and a thread that must keep the full count whatever runs beside it (the service's learner)
pins it when it starts (`pin_threads`).
"""

import contextlib
import threading
import time
from collections import defaultdict

import torch


def pin_threads(count: int) -> None:
    """Fix the calling thread's intra-op thread count (a thread pool's initializer)."""
    torch.set_num_threads(count)


class ThreadChoice:
    """Picks the intra-op thread count per batch size (module docstring). Thread safe: the scoring lane and the
    learner's probe reads share one scorer.

    choices: the counts to choose from (default: one and torch's count when built); with one choice it does nothing.
    trials: batches each choice runs per bucket before the choice is made; recheck: after that, every recheck-th
        batch of a bucket runs the choice not taken, so a change of load is seen.
    """

    def __init__(self, choices: tuple[int, ...] | None = None, trials: int = 3, recheck: int = 32):
        full = torch.get_num_threads()
        self.choices = tuple(sorted(set(choices or (1, full))))
        self.trials, self.recheck = trials, recheck
        self._seconds_per_row: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        self._batches: dict[int, int] = defaultdict(int)
        self._lock = threading.Lock()

    @staticmethod
    def bucket(rows: int) -> int:
        return max(rows, 1).bit_length()  # 1, 2-3, 4-7, ...

    def pick(self, rows: int) -> int:
        """The thread count for a forward of `rows` rows."""
        if len(self.choices) == 1:
            return self.choices[0]
        bucket = self.bucket(rows)
        with self._lock:
            timings = self._seconds_per_row[bucket]
            for choice in self.choices:  # each choice's trials first
                if len(timings[choice]) < self.trials:
                    return choice
            ranked = sorted(self.choices, key=lambda c: _median(timings[c]))
            self._batches[bucket] += 1
            return ranked[1] if self._batches[bucket] % self.recheck == 0 else ranked[0]

    def record(self, rows: int, threads: int, seconds: float) -> None:
        """A forward's time; only the latest few per choice are kept, so the choice follows the load."""
        with self._lock:
            kept = self._seconds_per_row[self.bucket(rows)][threads]
            kept.append(seconds / max(rows, 1))
            del kept[:-self.trials]

    @contextlib.contextmanager
    def running(self, rows: int):
        """Run the body (one forward of `rows` rows) with the picked count in this thread, timed and recorded."""
        threads, previous = self.pick(rows), torch.get_num_threads()
        if threads != previous:
            torch.set_num_threads(threads)
        start = time.perf_counter()
        try:
            yield threads
        finally:
            self.record(rows, threads, time.perf_counter() - start)
            if threads != previous:
                torch.set_num_threads(previous)

    def chosen(self) -> dict[int, int]:
        """{smallest rows of a bucket: the count it runs with now} for buckets past their trials (for logs)."""
        with self._lock:
            return {1 << (bucket - 1): min(self.choices, key=lambda c: _median(timings[c]))
                    for bucket, timings in sorted(self._seconds_per_row.items())
                    if all(len(timings[c]) >= self.trials for c in self.choices)}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("inf")
