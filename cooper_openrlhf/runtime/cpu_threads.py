"""How many intra-op threads a CPU forward of a given size should use, learnt from the forwards themselves.

On a small CPU a forward of a few rows runs faster on one thread than on all of them: waking the OpenMP team costs
more than the work it shares (with the passive wait policy `cli.serve` sets, every forward pays that wake-up), while
a large batch runs faster on all. Where the crossover lies depends on the model and the machine (a small decoder's
lies several times higher than an encoder's; `benchmarks/rm_forward_threads.py` prints both), so no fixed threshold
is right: `ThreadChoice` measures it.

Per bucket of rows (powers of two) it times each count on the bucket's first batches, then runs the faster and times
the other again every `recheck` batches, since the machine's load moves the crossover. A row's time is the best of
the last few, because interference and a first call's warm-up only ever slow a forward down. Two shortcuts keep
the trials cheap, since a one-thread trial of a large batch of a real RM costs about as much as the batch:
- all threads clearly faster (CLEAR_MARGIN) after one trial each decides the bucket for good: later timings move
  its choice (to the faster best time), they do not reopen its trials, so /metrics never shows it undecided again;
- a bucket not yet timed takes what a timed neighbour implies, as more threads pay off more as batches grow (all
  threads above a bucket where all won, one thread below a bucket where one won).

The count is torch's per-thread OpenMP setting: `torch.set_num_threads` changes the calling thread's count (and the
default a thread that has not run torch yet starts from), so `ThreadChoice.running` puts the previous count back
after each forward, and a thread that must keep the full count whatever runs beside it (the service's learner) pins
it when it starts (`pin_threads`).
"""

import contextlib
import threading
import time
from collections import defaultdict

import torch

CLEAR_MARGIN = 1.25  # all threads this many times faster a row after one trial each: decided without more trials


def pin_threads(count: int) -> None:
    """Fix the calling thread's intra-op thread count (a thread pool's initializer)."""
    torch.set_num_threads(count)


class ThreadChoice:
    """Picks the intra-op thread count per batch size (module docstring). Thread safe: the scoring lane and the
    learner's probe reads share one scorer.

    choices: the two counts to choose from (default: one and torch's count when built); with one it does nothing.
    trials: batches each choice runs per bucket before the choice is made; recheck: after that, every recheck-th
        batch of a bucket runs the choice not taken, so a change of load is seen.
    """

    def __init__(self, choices: tuple[int, ...] | None = None, trials: int = 3, recheck: int = 32):
        full = torch.get_num_threads()
        self.choices = tuple(sorted(set(choices or (1, full))))
        if len(self.choices) > 2:
            raise ValueError(f"two thread counts at most (fewer, more), got {self.choices}")
        self.trials, self.recheck = trials, recheck
        self._seconds_per_row: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        self._batches: dict[int, int] = defaultdict(int)
        self._settled: set[int] = set()  # buckets decided by the clear margin
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
            best = self._best(bucket)
            if best is None:  # trials, in turn, the more threads first (torch's own default)
                timings = self._seconds_per_row[bucket]
                return min(self.choices, key=lambda c: (len(timings[c]), -c))
            self._batches[bucket] += 1
            other = self.choices[1 - self.choices.index(best)]
            return other if self._batches[bucket] % self.recheck == 0 else best

    def _decided(self, bucket: int) -> int | None:
        """The faster count in `bucket` by its own timings, or None before its trials."""
        timings = self._seconds_per_row.get(bucket, {})
        best = {c: min(timings[c]) for c in self.choices if timings.get(c)}
        if len(best) < len(self.choices):
            return None
        fewer, more = self.choices
        if best[fewer] >= CLEAR_MARGIN * best[more]:
            self._settled.add(bucket)
        if bucket in self._settled or all(len(timings[c]) >= self.trials for c in self.choices):
            return min(best, key=best.get)
        return None

    def _best(self, bucket: int) -> int | None:
        """The bucket's own choice, else the one a tried neighbour implies (module docstring), else None."""
        own = self._decided(bucket)
        if own is not None:
            return own
        fewer, more = self.choices
        tried = {b: self._decided(b) for b in list(self._seconds_per_row)}
        if any(choice == more for b, choice in tried.items() if b < bucket):
            return more
        if any(choice == fewer for b, choice in tried.items() if b > bucket):
            return fewer
        return None

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
        """{smallest rows of a bucket: the count it runs with now, by its own timings or a neighbour's} for the
        buckets seen that are past their trials (the service's /metrics)."""
        with self._lock:
            best = {1 << (bucket - 1): self._best(bucket) for bucket in sorted(self._seconds_per_row)}
        return {rows: choice for rows, choice in best.items() if choice is not None}
