"""The one-process service's rule verifier: a deadline per sample, so that no answer can hold up the others.

The service's batcher hands each verifier lane a batch of up to `--max-batch` items (`serve/batcher.py`). Were each
lane one `verify.pool.VerifierPool` verifying its batch in turn, an answer that takes seconds (math-verify spends ~2
s or more on `\\boxed{9^{9^{9^{9}}}}`) would hold every item behind it in its batch, each batch would be answered
only once its slowest item was, and a policy drifting into such answers would cap the service at about lanes / 2 s
samples a second, its requests timing out. `SharedLanes` instead:
- answers a lane's call at once with one future per item (the batcher's results that arrive later): the lane is
  free again, and each item is answered when its own verdict is, whatever the rest of its batch does;
- puts every item in one queue that all its pools (one worker process each, `--verify-workers`) take from, one
  item at a time: a slow item holds one worker, and the other workers take the items behind it. Workers are
  processes, so while a few grind on slow answers the operating system shares the cores with the ones verifying
  ordinary answers (about a millisecond each); a worker costs ~15 MiB of its own memory;
- gives each item a deadline of its own, `deadline_s` from when its lane took it (its wait behind slower answers
  included): an item without a verdict by then is answered TIMEOUT at that moment, whether it is still queued or
  being verified, which the service pays as it paid the pool's deadline before: the RM's reward, not verified
  (`cooper/rule_correct` 0). An item still queued at its deadline is never started, so a backlog of slow answers
  costs each sample at most its deadline and no worker time once overdue. One being verified is stopped by its
  pool's own hard deadline (the same `deadline_s`, counted from when its worker took it).
More slow answers at once than workers do queue, each only until its deadline. A trainer's real load never meets the
deadline: ordinary answers take about a millisecond each. Thread-safe: lanes are called from the batcher's worker
threads; each pool is used by its own dispatching thread only; one watching thread answers overdue items.
"""

import collections
import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome

logger = logging.getLogger(__name__)


@dataclass
class _Item:
    reference: str
    completion: str
    deadline: float  # time.monotonic() by which its verdict is due
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


def _settle(future: concurrent.futures.Future, outcome) -> bool:
    """Give `future` its outcome (a result or an Exception) unless it has one already; whether this one was taken."""
    try:
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except concurrent.futures.InvalidStateError:  # the deadline and the verdict crossed: the first one stands
        return False
    return True


class SharedLanes:
    """`lanes()`: `lanes` lane functions for the batcher, (references, completions) -> one future per item of its
    outcome, all served by `pools` (each a `verify.pool.VerifierPool`, typically of one worker); see the module
    docstring."""

    def __init__(self, pools: list, deadline_s: float, lanes: int = 2):
        if not pools or deadline_s <= 0 or lanes < 1:
            raise ValueError(f"need at least one pool, deadline_s > 0 and lanes >= 1; got {len(pools)}, {deadline_s}, "
                             f"{lanes}")
        self.pools, self.deadline_s, self.lane_count = list(pools), deadline_s, lanes
        self.overdue = 0  # items answered TIMEOUT at their deadline (not the pools' own TIMEOUTs)
        self._closing = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._due: collections.deque[_Item] = collections.deque()  # by deadline: every item gets the same delay
        self._due_changed = threading.Condition()
        self._threads = [threading.Thread(target=self._dispatch, args=(pool,), name=f"verifier-{i}", daemon=True)
                         for i, pool in enumerate(self.pools)]
        self._threads.append(threading.Thread(target=self._watch, name="verifier-deadlines", daemon=True))
        for thread in self._threads:
            thread.start()

    def lanes(self) -> list:
        """The batcher's lane functions."""
        return [self.verify] * self.lane_count

    def verify(self, references: list[str], completions: list[str]) -> list[concurrent.futures.Future]:
        """One future per item of its `VerifyOutcome` (or of the exception its pool raised on it), each done by the
        item's deadline at the latest. Returns at once."""
        deadline = time.monotonic() + self.deadline_s
        items = [_Item(reference, completion, deadline) for reference, completion in zip(references, completions)]
        with self._due_changed:
            self._due.extend(items)
            self._due_changed.notify()
        for item in items:
            self._queue.put(item)
        return [item.future for item in items]

    def _dispatch(self, pool) -> None:
        """A pool's thread: the queue's next item that is not yet answered, verified on this pool."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            if item.future.done():  # answered TIMEOUT at its deadline while queued: no work for it
                continue
            if self._closing:
                _settle(item.future, RuntimeError("the rule verifier is shutting down"))
                continue
            try:
                outcome = pool.verify_batch([item.reference], [item.completion]).outcomes[0]
            except Exception as exc:  # that item's own failure (an empty reference, a closed pool)
                outcome = exc
            _settle(item.future, outcome)

    def _watch(self) -> None:
        """The deadlines' thread: each item still without a verdict at its deadline is answered TIMEOUT."""
        while True:
            with self._due_changed:
                while not self._due or self._due[0].deadline > time.monotonic():
                    if self._closing and not self._due:
                        return
                    self._due_changed.wait(self._due[0].deadline - time.monotonic() if self._due else None)
                item = self._due.popleft()
            if _settle(item.future, VerifyOutcome(Verdict.TIMEOUT, None, self.deadline_s,
                                                  f"no verdict within the per-sample deadline of "
                                                  f"{self.deadline_s:g}s (--verify-deadline-s)")):
                self.overdue += 1

    def close(self) -> None:
        """Stop the threads (a dispatching one after the item it is verifying; queued items fail), then the pools."""
        self._closing = True
        for _ in self.pools:
            self._queue.put(None)
        with self._due_changed:
            for item in self._due:
                _settle(item.future, RuntimeError("the rule verifier is shutting down"))
            self._due.clear()
            self._due_changed.notify()
        for thread in self._threads:
            thread.join()
        for pool in self.pools:
            pool.close()
