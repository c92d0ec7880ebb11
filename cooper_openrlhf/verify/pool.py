"""VerifierPool: rule verification in worker processes, with a hard per-item deadline.

One `multiprocessing.Process` per worker, each with its own `Pipe`. The dispatcher runs in the
calling thread: it keeps every worker fed and waits on the busy workers' pipes and process
sentinels with `multiprocessing.connection.wait`, never longer than the nearest deadline. A
worker still busy at its item's deadline is SIGKILLed and replaced; the item gets TIMEOUT. A
worker that dies on its own (segfault, OOM kill) is replaced too; its item gets ERROR. The other
items it held (not started, or finished but not yet reported) go back to the queue.

Why processes: math-verify's `signal.alarm` cannot stop a single long C call and cannot be used
outside a main thread, while the callers are threads, asyncio loops and Ray actors. Killing a
process works everywhere and needs no signal handler in the caller.

Why chunks (the shape of the protocol, see `pool_worker`): a GSM8K answer takes ~0.5 ms to
verify, and on a 2-core machine every microsecond the dispatcher spends is taken from the
workers. With one message per item each way and items dealt out one at a time, the dispatcher
spent ~90 us of CPU per item and the pool as a whole 1.2-2x serial's CPU per item (a wake-up per
message; the two answers to a prompt split across workers, so both parsed its reference): the
pool ran at 0.5-0.7x serial. Now the dispatcher spends ~20 us per item and the pool 0.75-0.95x
serial's CPU per item on GSM8K (benchmarks/verifier_throughput.py prints both). So:

- items travel in chunks (one message of up to `CHUNK_MAX_ITEMS`; guided sizing, about
  pending / (2 x workers), so the last chunks of a batch are small and the workers finish
  together), and each worker holds at most `CHUNKS_PER_WORKER` = 2 unfinished chunks, so it
  never idles for a round trip;
- a worker sends a chunk's results in one message (and sooner, before starting an item, once a
  result is `FLUSH_S` old, so that a kill wastes little finished work);
- the dispatcher still knows which item runs and since when, without a message per item: the
  worker publishes, before each item, a shared 64-bit word (count of items started, start
  time). The deadline clock of each item starts when the worker starts it, so an item queued
  behind a slow one is not charged for the wait, and a hung item is killed at its own
  deadline; the rest of its chunk is re-run on other workers;
- items with the same reference are queued together, so that the rollouts of one prompt share
  a chunk and a worker, which parses the reference once (caches are per process): with items
  dealt out one by one, both workers parsed most references;
- the wire carries tuples of str (dataclasses and enums pickle several times slower).

Measured and dropped: extracting answers in the parent (to send workers only the answer). It
moves ~10 us per KB of completion from the workers to the dispatcher, which saves no CPU in total
on 2 cores and would make the one dispatcher the bottleneck with many workers. The parent
extracts only to report the answer of a killed item (`_answer_of`; extraction is linear-time).

Chunks are capped at `CHUNK_MAX_BYTES`, so that two queued chunks fit the socket pair's send
buffer (~200 KiB on Linux) and a send never blocks the dispatcher while a worker is busy. A larger
item goes alone, and only to an idle worker (which reads it as it is written).

Workers start with the "forkserver" method where available (else "spawn"): never plain fork,
since the caller may hold threads and locks. They import math-verify and warm sympy up once,
before they take their first item, so no deadline pays for imports. As with any spawn or
forkserver pool, a script that makes one must guard its entry point with
``if __name__ == "__main__":``.

Thread safety: batches are served one at a time (a lock); a batch from another thread waits.
Results come back in input order.
"""

import asyncio
import logging
import multiprocessing as mp
import os
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from cooper_openrlhf.verify.extract import extract_answer, normalize_answer
from cooper_openrlhf.verify.pool_worker import PRELOAD_MODULES, ChunkItem, WorkerHandle
from cooper_openrlhf.verify.rule import RuleVerifierConfig, Verdict, VerifyOutcome, equivalence_from_verdict

logger = logging.getLogger(__name__)

CHUNK_MAX_ITEMS = 32  # ~16 ms of GSM8K items: the per-message cost is ~1% of it
CHUNKS_PER_WORKER = 2  # one running, one queued behind it
CHUNK_MAX_BYTES = 48 * 1024  # two queued chunks must fit the socket buffer

_VERDICTS = {verdict.value: verdict for verdict in Verdict}


@dataclass
class BatchResult:
    """Outcomes of one batch, in input order, with counts per verdict and wall-clock seconds.

    latency_seconds[i]: from when item i started on a worker until its verdict, as the worker
    measured it; for a killed item, until the dispatcher noticed its deadline or death.
    """

    outcomes: list[VerifyOutcome]
    counts: dict[Verdict, int] = field(default_factory=dict)
    wall_seconds: float = 0.0
    latency_seconds: list[float] = field(default_factory=list)

    @property
    def verdicts(self) -> list[Verdict]:
        return [outcome.verdict for outcome in self.outcomes]

    @property
    def extracted(self) -> list[str | None]:
        return [outcome.extracted for outcome in self.outcomes]


class _Batch:
    """One batch being served: its jobs (one kind; per item a left and a right string), the queue, results so far.

    verify: left = reference, right = completion; equivalent: left = answer_a, right = answer_b.
    The queue holds items with the same left string together, in order of first appearance, so
    that they tend to share a chunk and a worker parses each reference once
    (`rule._parse_reference` is cached per process), however the caller ordered them.
    """

    def __init__(self, kind: str, lefts: list[str], rights: list[str]):
        self.kind = kind
        self.lefts = lefts
        self.rights = rights
        groups: dict[str, list[int]] = {}
        for index, left in enumerate(lefts):
            groups.setdefault(left, []).append(index)
        self.pending: deque[int] = deque(index for group in groups.values() for index in group)
        self.outcomes: list[VerifyOutcome | None] = [None] * len(lefts)
        self.latencies = [0.0] * len(lefts)


def _wire_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


class VerifierPool:
    """A reusable pool of verifier processes.

    num_workers: defaults to the number of CPUs this process may use.
    deadline_s: hard limit per item, from its start on a worker to its result (seconds, float).
    startup_timeout_s: how long a starting worker may take to import and warm up.
    """

    def __init__(
        self,
        num_workers: int | None = None,
        deadline_s: float = 5.0,
        config: RuleVerifierConfig = RuleVerifierConfig(),
        start_method: str | None = None,
        startup_timeout_s: float = 120.0,
    ):
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.num_workers = num_workers or len(os.sched_getaffinity(0))
        self.deadline_s = deadline_s
        self.config = config
        self.startup_timeout_s = startup_timeout_s
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        if start_method == "fork":
            raise ValueError("fork is unsafe when the caller holds threads; use 'forkserver' or 'spawn'")
        self._context = mp.get_context(start_method)
        if start_method == "forkserver":
            # Forks of a server that already imported the verifier start in milliseconds.
            self._context.set_forkserver_preload(PRELOAD_MODULES)
        self._lock = threading.Lock()
        self._closed = False
        self.workers_replaced = 0
        self._workers = [WorkerHandle(self._context, config) for _ in range(self.num_workers)]
        self._wait_until_ready()

    # ---------------------------------------------------------------- public API
    def verify_batch(self, references: list[str], completions: list[str]) -> BatchResult:
        """Verify completions[i] against references[i]; outcomes in input order."""
        if len(references) != len(completions):
            raise ValueError(f"{len(references)} references but {len(completions)} completions")
        for i, (reference, completion) in enumerate(zip(references, completions)):
            if not isinstance(reference, str) or not isinstance(completion, str):
                raise TypeError(f"item {i}: reference and completion must be str")
            if normalize_answer(reference) is None:
                raise ValueError(f"item {i}: reference answer is empty")
        return self._run(_Batch("verify", list(references), list(completions)))

    def equivalence_batch(self, answers_a: list[str], answers_b: list[str]) -> list[bool | None]:
        """For each pair: True equivalent, False provably different, None undecided (see rule.answers_equivalent)."""
        if len(answers_a) != len(answers_b):
            raise ValueError(f"{len(answers_a)} answers_a but {len(answers_b)} answers_b")
        result = self._run(_Batch("equivalent", list(answers_a), list(answers_b)))
        return [equivalence_from_verdict(verdict) for verdict in result.verdicts]

    async def averify_batch(self, references: list[str], completions: list[str]) -> BatchResult:
        """`verify_batch` for asyncio code: runs in a thread so the event loop keeps serving."""
        return await asyncio.to_thread(self.verify_batch, references, completions)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (they change when a worker is replaced)."""
        return [worker.process.pid for worker in self._workers]

    def close(self) -> None:
        """Stop all workers (politely, then by SIGKILL). Safe to call more than once."""
        with self._lock:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (BrokenPipeError, OSError):
                pass  # already dead: kill() below reaps it
        for worker in self._workers:
            worker.process.join(timeout=2.0)
            worker.kill()
            worker.conn.close()
        self._workers = []

    def __enter__(self) -> "VerifierPool":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---------------------------------------------------------------- start-up and replacement
    def _wait_until_ready(self) -> None:
        give_up_at = time.monotonic() + self.startup_timeout_s
        while not all(worker.ready for worker in self._workers):
            starting = [worker for worker in self._workers if not worker.ready]
            remaining = give_up_at - time.monotonic()
            if remaining <= 0:
                self._shutdown()
                raise TimeoutError(f"verifier workers did not start within {self.startup_timeout_s}s")
            wait([w.conn for w in starting] + [w.process.sentinel for w in starting], timeout=min(remaining, 1.0))
            for worker in starting:
                if worker.conn.poll(0) or not worker.process.is_alive():
                    self._receive_ready(worker)

    def _receive_ready(self, worker: WorkerHandle) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            message = None
        if not worker.set_ready(message):
            exitcode = worker.process.exitcode
            self._shutdown()
            raise RuntimeError(f"verifier worker failed to start (exit code {exitcode}, message {message!r})")

    def _retire(
        self, worker: WorkerHandle, batch: _Batch, now: float, timed_out: tuple[int, float] | None = None
    ) -> None:
        """Kill `worker` (if alive) and replace it; its other unanswered items go back to the queue.

        timed_out: (batch index, deadline clock start) of the item that passed its deadline; it
        gets TIMEOUT. Without it, the worker died (or its pipe broke): the item it was on gets ERROR.
        """
        worker.kill()
        if not worker.ready:
            worker.conn.close()
            raise RuntimeError(f"replacement verifier worker failed to start (exit code {worker.process.exitcode})")
        for results in worker.drain():  # finished work that was on its way: keep it
            self._accept(worker, batch, results, now)
        if worker.in_flight:
            # Dead, its progress word is final: it names the item it was on (see WorkerHandle.current).
            index, clock = timed_out if timed_out is not None else worker.current()
            if batch.outcomes[index] is None:  # (else it finished as it was killed: nobody is charged)
                if timed_out is not None:
                    verdict, error = Verdict.TIMEOUT, None
                    logger.warning("verifier item %d passed its %.1fs deadline: killed", index, self.deadline_s)
                else:
                    verdict, error = Verdict.ERROR, f"worker died with exit code {worker.process.exitcode}"
                    logger.error("verifier %s on item %d", error, index)
                batch.latencies[index] = now - clock
                batch.outcomes[index] = VerifyOutcome(verdict, self._answer_of(batch, index), now - clock, error)
            batch.pending.extendleft(reversed([i for i in worker.in_flight if i != index]))
        self._workers[self._workers.index(worker)] = WorkerHandle(self._context, self.config)
        self.workers_replaced += 1

    def _answer_of(self, batch: _Batch, index: int) -> str | None:
        """The answer a killed job was judging (extraction is linear-time: safe in the dispatcher)."""
        right = batch.rights[index]
        if batch.kind != "verify":
            return right
        return extract_answer(right, fallback=self.config.answer_fallback)

    # ---------------------------------------------------------------- dispatcher
    def _run(self, batch: _Batch) -> BatchResult:
        with self._lock:
            if self._closed:
                raise RuntimeError("VerifierPool is closed")
            start = time.perf_counter()
            try:
                while batch.pending or any(worker.in_flight for worker in self._workers):
                    self._dispatch(batch)
                    self._collect(batch)
            except BaseException:
                # Workers may hold items of this batch: the pool cannot serve another one safely.
                logger.error("verifier batch aborted; closing the pool")
                self._shutdown()
                raise
            counts = Counter(outcome.verdict for outcome in batch.outcomes)
            return BatchResult(batch.outcomes, dict(counts), time.perf_counter() - start, batch.latencies)

    def _next_chunk(self, batch: _Batch, worker_idle: bool) -> list[ChunkItem]:
        """Up to a guided-size share of the queue, within the byte cap (a larger item goes alone to an idle worker)."""
        pending = batch.pending
        target = min(CHUNK_MAX_ITEMS, -(-len(pending) // (CHUNKS_PER_WORKER * self.num_workers)))
        chunk: list[ChunkItem] = []
        chunk_bytes = 0
        while pending and len(chunk) < target:
            index = pending[0]
            left, right = batch.lefts[index], batch.rights[index]
            size = _wire_bytes(left) + _wire_bytes(right)
            if chunk_bytes + size > CHUNK_MAX_BYTES and (chunk or not worker_idle):
                break
            pending.popleft()
            chunk.append((index, batch.kind, left, right))
            chunk_bytes += size
        return chunk

    def _dispatch(self, batch: _Batch) -> None:
        now = time.monotonic()
        for worker in self._workers:
            while batch.pending and worker.ready and len(worker.chunk_ends) < CHUNKS_PER_WORKER:
                chunk = self._next_chunk(batch, worker_idle=not worker.in_flight)
                if not chunk:
                    break
                try:
                    worker.send(chunk, now)
                except (BrokenPipeError, ConnectionResetError):
                    logger.error("verifier worker's pipe broke (exit code %s); replacing it", worker.process.exitcode)
                    batch.pending.extendleft(reversed([item[0] for item in chunk]))
                    self._retire(worker, batch, now)
                    break

    def _collect(self, batch: _Batch) -> None:
        """Wait for the next event (results, a death, a ready replacement or a deadline) and handle it."""
        watched = [w for w in self._workers if w.in_flight or not w.ready]
        if not watched:
            return
        deadlines = [
            w.current()[1] + self.deadline_s if w.ready else w.launched_at + self.startup_timeout_s for w in watched
        ]
        timeout = max(0.0, min(deadlines) - time.monotonic())
        # Readiness comes from this one wait(): per-worker poll()/is_alive() would each cost a syscall round.
        ready = set(wait([w.conn for w in watched] + [w.process.sentinel for w in watched], timeout=timeout))
        now = time.monotonic()
        for worker in watched:
            if worker.conn in ready:
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):  # the pipe closed: the worker is dead or dying
                    self._retire(worker, batch, now)
                    continue
                if not worker.ready:
                    if not worker.set_ready(message):
                        raise RuntimeError(f"replacement verifier worker sent {message!r} before it was ready")
                    continue
                self._accept(worker, batch, message, now)
            elif worker.process.sentinel in ready:  # exited without a word
                self._retire(worker, batch, now)
            elif not worker.ready:
                if now >= worker.launched_at + self.startup_timeout_s:
                    raise TimeoutError(f"replacement verifier worker did not start within {self.startup_timeout_s}s")
            elif worker.in_flight:
                # Read afresh: the worker may have moved on to another item since the wait began.
                index, clock = worker.current()
                if now >= clock + self.deadline_s:
                    self._retire(worker, batch, now, timed_out=(index, clock))

    @staticmethod
    def _accept(worker: WorkerHandle, batch: _Batch, results: list[tuple], now: float) -> None:
        """A results message from a live (or just killed) worker."""
        worker.mark = now
        for index, verdict, extracted, seconds, latency, error in results:
            worker.take(index)
            batch.outcomes[index] = VerifyOutcome(_VERDICTS[verdict], extracted, seconds, error)
            batch.latencies[index] = latency
