"""Batching across concurrent requests: many one-sample requests in, one model call per batch out.

OpenRLHF sends one sample per request, hundreds at once during a step; a GPU scores 64 samples in about the time
it scores one. `MicroBatcher` collects items from concurrent coroutines into batches of at most `max_batch` and
runs the batch function in a worker thread (the event loop keeps accepting requests meanwhile). A batch is what is
queued when a lane is free, so a lone request on an idle lane runs at once (a window would be pure latency: nothing
else is coming) and the requests that arrive while a batch runs form the next one. Only a lane that was busy (its
first item was already waiting when it came free) waits up to `max_wait_s` for the batch to fill. The queue has
no bound of its own: an item that finds the batch function busy waits its turn, because a refusal is a failed try
for OpenRLHF's client and five of them crash the run. What bounds the queue is the HTTP layer's admission limit
(`serve/admission.py`), a memory bound no trainer's step reaches, and a request's own timeout.

A lone item on a lane whose lone items run quicker than the window (`inline_lone`, the RM's lane) runs in the event
loop itself: handing it to a worker thread and back costs two thread wake-ups, a large share of a millisecond's
forward, and holding the loop for less than the window delays other requests no more than the window already does.
A lane's first lone item, and any after one that took longer, runs in a thread.

Lanes: one batch function per lane, one batch running per lane. The RM has one lane (one model). The rule
verifier has several.

A lane may be a coroutine function instead: it runs on the event loop, no thread, for a batch that is one remote
call awaited (the replicated ingress's calls to its group registry). It returns one outcome per item, a result or
an Exception; if it raises, every item of its batch gets the exception: a remote call is not split and sent again
in halves (it may have done part of its work).

Results that arrive later: a batch function may return, for an item, a `concurrent.futures.Future` of its result
instead of the result. The lane is then free as soon as the call returns, and that item is answered when its future
is, whatever the rest of its batch does: the rule verifier (`serve/verification.py`) hands its items to shared
workers this way, so that a slow item holds up no other item of its batch, nor the lane.

Each item fails alone: when the batch function raises on a batch, the batch is split in halves and each half
tried again (down to single items), so only the items that fail on their own get the exception, never a default
value, and the rest of the batch gets its results. One bad item among B costs about 2 log2(B) more calls.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass
class BatchStats:
    batches: int = 0
    items: int = 0
    busy_seconds: float = 0.0  # time spent inside the batch function
    largest: int = 0


class MicroBatcher:
    """`await submit(item)` -> the batch function's result for `item` (see the module docstring).

    fn: a blocking function of a list of items returning a list of results of the same length, in order; or a
        list of such functions, one per lane; or coroutine functions (module docstring).
    inline_lone: whether a lone item may run in the event loop (module docstring); only for a function that never
        waits on anything but the CPU or GPU (not the verifier pools, not a remote call).
    """

    def __init__(self, fn: Callable[[list], Sequence] | list[Callable[[list], Sequence]], max_batch: int = 64,
                 max_wait_s: float = 0.005, name: str = "batcher", inline_lone: bool = False):
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError(f"need max_batch >= 1, max_wait_s >= 0; got {max_batch}, {max_wait_s}")
        self.lanes = list(fn) if isinstance(fn, (list, tuple)) else [fn]
        self.max_batch, self.max_wait_s, self.name = max_batch, max_wait_s, name
        self.inline_lone = inline_lone
        self._lone_seconds: float | None = None  # the batch function's time on the last lone item
        self.stats = BatchStats()
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._queue = asyncio.Queue()
        self._free_lanes = asyncio.Queue()
        for lane in range(len(self.lanes)):
            self._free_lanes.put_nowait(lane)
        self._running: set[asyncio.Task] = set()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for task in list(self._running):
            task.cancel()

    @property
    def queued(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    async def submit(self, item):
        """The result for one item (raises what the batch function raised on this item alone: `results_or_errors`)."""
        return (await self.submit_many([item]))[0]

    async def submit_many(self, items: list) -> list:
        """Results for several items (they may land in different batches)."""
        if self._queue is None:
            raise RuntimeError(f"{self.name} is not started")
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        for item, future in zip(items, futures):
            self._queue.put_nowait((item, future))
        return list(await asyncio.gather(*futures))

    async def _loop(self) -> None:
        while True:
            lane = await self._free_lanes.get()
            was_busy = not self._queue.empty()  # items waited for this lane: the batcher is under load
            batch = [await self._queue.get()]
            await self._fill(batch, self.max_wait_s if was_busy else 0.0)
            batch = [(item, future) for item, future in batch if not future.cancelled()]  # clients that left
            if not batch:
                self._free_lanes.put_nowait(lane)
                continue
            task = asyncio.get_running_loop().create_task(self._run(lane, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _fill(self, batch: list, wait_s: float) -> None:
        """Add what is queued to `batch`, then items as they arrive for at most `wait_s`, up to `max_batch`."""
        deadline = time.monotonic() + wait_s
        while len(batch) < self.max_batch:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:
                return

    async def _run(self, lane: int, batch: list) -> None:
        start = time.perf_counter()
        items = [item for item, _ in batch]
        try:
            if asyncio.iscoroutinefunction(self.lanes[lane]):
                outcomes = _checked(list(await self.lanes[lane](items)), items, self.name)
            elif len(batch) == 1 and self.inline_lone and self._lone_seconds is not None \
                    and self._lone_seconds < self.max_wait_s:
                outcomes, self._lone_seconds = _timed(self.lanes[lane], items, self.name)
            else:
                outcomes, seconds = await asyncio.to_thread(_timed, self.lanes[lane], items, self.name)
                if len(batch) == 1:
                    self._lone_seconds = seconds
        except Exception as exc:  # a bug outside the batch function: every waiting request gets it, none a default
            outcomes = [exc] * len(batch)
        later = []  # (waiting future, the future of its result)
        try:
            for (_, future), outcome in zip(batch, outcomes):
                if isinstance(outcome, Future):
                    later.append((future, outcome))
                elif future.done():
                    continue
                elif isinstance(outcome, Exception):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
        finally:
            self.stats.batches += 1
            self.stats.items += len(batch)
            self.stats.largest = max(self.stats.largest, len(batch))
            if later:
                self._answer_later(later, start)
            else:
                self.stats.busy_seconds += time.perf_counter() - start
            self._free_lanes.put_nowait(lane)

    def _answer_later(self, later: list, start: float) -> None:
        """Answer each waiting future when its result's future is done (on the event loop); the batch's busy time
        runs until its last result."""
        remaining = len(later)

        def settle(waiting: asyncio.Future, result: asyncio.Future) -> None:
            nonlocal remaining
            if not waiting.done():
                if result.cancelled():
                    waiting.cancel()
                elif result.exception() is not None:
                    waiting.set_exception(result.exception())
                else:
                    waiting.set_result(result.result())
            remaining -= 1
            if not remaining:
                self.stats.busy_seconds += time.perf_counter() - start

        for waiting, result in later:
            asyncio.wrap_future(result).add_done_callback(lambda done, waiting=waiting: settle(waiting, done))


def _timed(fn: Callable[[list], Sequence], items: list, name: str) -> tuple[list, float]:
    """`results_or_errors` and the seconds it took (where it ran: the hand-off to a thread is not counted)."""
    start = time.perf_counter()
    outcomes = results_or_errors(fn, items, name)
    return outcomes, time.perf_counter() - start


def results_or_errors(fn: Callable[[list], Sequence], items: list, name: str = "batch") -> list:
    """`fn(items)`, except that where it raises, each item gets its own result or its own exception (bisection).

    Blocking; one entry per item, in order: a result, or the Exception instance that `fn` raised on the smallest
    part holding that item (a single item, unless a part failed for a reason that is not any one item's)."""
    try:
        results = list(fn(items))
    except Exception as exc:
        if len(items) == 1:
            return [exc]
        logger.warning("%s: a batch of %d failed (%s: %s); scoring its halves apart", name, len(items),
                       type(exc).__name__, exc)
        return _bisect(fn, items)
    return _checked(results, items, name)


def _bisect(fn: Callable[[list], Sequence], items: list) -> list:
    """Each half of `items` tried on its own, recursively (quietly: the caller logged the batch's failure)."""
    middle = len(items) // 2
    outcomes = []
    for part in (items[:middle], items[middle:]):
        try:
            outcomes += _checked(list(fn(part)), part, "part")
        except Exception as exc:
            outcomes += [exc] if len(part) == 1 else _bisect(fn, part)
    return outcomes


def _checked(results: list, items: list, name: str) -> list:
    """`results`, or one error per item when their count is not the items' (a bug in the batch function)."""
    if len(results) != len(items):
        return [RuntimeError(f"{name}: {len(results)} results for {len(items)} items")] * len(items)
    return results
