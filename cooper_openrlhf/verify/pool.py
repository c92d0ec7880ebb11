"""VerifierPool: rule verification in worker processes, with a hard per-item deadline.

One `multiprocessing.Process` per worker, each with its own `Pipe`. The dispatcher runs in the
calling thread: it keeps every worker fed and waits on the busy workers' pipes and process
sentinels with `multiprocessing.connection.wait`, never longer than the nearest deadline. A
worker still busy at its item's deadline is SIGKILLed and replaced; the item gets TIMEOUT. A
worker that dies on its own (segfault, OOM kill) is replaced too; its item gets ERROR. Items
sent to a killed worker but not yet started go back to the queue.

Why this shape: math-verify's `signal.alarm` cannot stop a single long C call and cannot be used
outside a main thread, while the callers are threads, asyncio loops and Ray actors. Killing a
process works everywhere and needs no signal handler in the caller.

Throughput: each worker holds one running item and, when it is small (<= PREFETCH_MAX_BYTES),
one queued behind it, so it never idles for a round trip through the dispatcher. A queued item's
deadline clock starts only when the result before it arrives. A queued item fits in the socket
pair's send buffer (~200 KiB on Linux), so sending it never blocks the dispatcher. The cost: an
item queued behind one that hangs waits for that one's kill, then runs on another worker.

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
from cooper_openrlhf.verify.pool_worker import PRELOAD_MODULES, READY, Job, WorkerHandle
from cooper_openrlhf.verify.rule import RuleVerifierConfig, Verdict, VerifyOutcome, equivalence_from_verdict

logger = logging.getLogger(__name__)

PREFETCH_MAX_BYTES = 32 * 1024  # a job queued behind a running one must fit the socket buffer


@dataclass
class BatchResult:
    """Outcomes of one batch, in input order, with counts per verdict and wall-clock seconds.

    latency_seconds[i]: from when item i started on a worker (as seen by the dispatcher) until its
    result, or its kill, arrived.
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


class VerifierPool:
    """A reusable pool of verifier processes.

    num_workers: defaults to the number of CPUs this process may use.
    deadline_s: hard limit per item, from dispatch to result (seconds, float).
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
        return self._run([("verify", r, c) for r, c in zip(references, completions)])

    def equivalence_batch(self, answers_a: list[str], answers_b: list[str]) -> list[bool | None]:
        """For each pair: True equivalent, False provably different, None undecided (see rule.answers_equivalent)."""
        if len(answers_a) != len(answers_b):
            raise ValueError(f"{len(answers_a)} answers_a but {len(answers_b)} answers_b")
        result = self._run([("equivalent", a, b) for a, b in zip(answers_a, answers_b)])
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
        self._workers = []

    def __enter__(self) -> "VerifierPool":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---------------------------------------------------------------- dispatcher
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
        if message != READY:
            exitcode = worker.process.exitcode
            self._shutdown()
            raise RuntimeError(f"verifier worker failed to start (exit code {exitcode}, message {message!r})")
        worker.ready = True

    def _replace(self, worker: WorkerHandle, pending: deque) -> None:
        """Kill `worker`, put its unstarted items back at the front of `pending`, start a new one."""
        worker.kill()
        pending.extendleft(reversed(list(worker.in_flight)[1:]))
        self._workers[self._workers.index(worker)] = WorkerHandle(self._context, self.config)
        self.workers_replaced += 1

    def _run(self, jobs: list[Job]) -> BatchResult:
        with self._lock:
            if self._closed:
                raise RuntimeError("VerifierPool is closed")
            start = time.perf_counter()
            outcomes: list[VerifyOutcome | None] = [None] * len(jobs)
            latencies = [0.0] * len(jobs)
            pending = deque(range(len(jobs)))
            try:
                while pending or any(worker.in_flight for worker in self._workers):
                    self._dispatch(jobs, pending)
                    self._collect(jobs, pending, outcomes, latencies)
            except BaseException:
                # Workers may hold items of this batch: the pool cannot serve another one safely.
                logger.error("verifier batch aborted; closing the pool")
                self._shutdown()
                raise
            counts = Counter(outcome.verdict for outcome in outcomes)
            return BatchResult(outcomes, dict(counts), time.perf_counter() - start, latencies)

    @staticmethod
    def _small(job: Job) -> bool:
        return len(job[1].encode()) + len(job[2].encode()) <= PREFETCH_MAX_BYTES

    def _dispatch(self, jobs: list[Job], pending: deque) -> None:
        for worker in self._workers:
            while pending and worker.ready and (
                not worker.in_flight or (len(worker.in_flight) == 1 and self._small(jobs[pending[0]]))
            ):
                index = pending.popleft()
                try:
                    worker.send(index, jobs[index])
                except (BrokenPipeError, ConnectionResetError):
                    logger.error("verifier worker died while idle (exit code %s); replacing it", worker.process.exitcode)
                    pending.appendleft(index)
                    self._replace(worker, pending)
                    break

    def _collect(self, jobs: list[Job], pending: deque, outcomes: list, latencies: list[float]) -> None:
        """Wait for the next event (a result, a death, a ready replacement or a deadline) and handle it."""
        watched = [w for w in self._workers if w.in_flight or not w.ready]
        deadlines = [
            w.head_started_at + self.deadline_s if w.ready else w.launched_at + self.startup_timeout_s for w in watched
        ]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 0.0
        # Readiness comes from this one wait(): per-worker poll()/is_alive() would each cost a syscall round.
        ready = set(wait([w.conn for w in watched] + [w.process.sentinel for w in watched], timeout=timeout))
        now = time.monotonic()
        for worker in watched:
            if worker.conn in ready:
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):  # the pipe closed: the worker is dead or dying
                    self._fail_head(worker, jobs, pending, outcomes, latencies, now, Verdict.ERROR)
                    continue
                self._accept(worker, message, outcomes, latencies, now)
            elif worker.process.sentinel in ready:  # exited without a word
                self._fail_head(worker, jobs, pending, outcomes, latencies, now, Verdict.ERROR)
            elif worker.in_flight and now >= worker.head_started_at + self.deadline_s:
                logger.warning("verifier item %d passed its %.1fs deadline; killing its worker", worker.in_flight[0], self.deadline_s)
                self._fail_head(worker, jobs, pending, outcomes, latencies, now, Verdict.TIMEOUT)
            elif not worker.ready and now >= worker.launched_at + self.startup_timeout_s:
                raise TimeoutError(f"replacement verifier worker did not start within {self.startup_timeout_s}s")

    @staticmethod
    def _accept(worker: WorkerHandle, message, outcomes: list, latencies: list[float], now: float) -> None:
        """A message from a live worker: READY from a replacement, else the result of its running item."""
        if not worker.ready:
            if message != READY:
                raise RuntimeError(f"replacement verifier worker sent {message!r} before it was ready")
            worker.ready = True
            return
        started = worker.head_started_at
        index = worker.finish_head()
        latencies[index] = now - started
        outcomes[index] = message

    def _fail_head(
        self,
        worker: WorkerHandle,
        jobs: list[Job],
        pending: deque,
        outcomes: list,
        latencies: list[float],
        now: float,
        verdict: Verdict,
    ) -> None:
        """The running item ends as `verdict` (TIMEOUT: killed at its deadline; ERROR: the worker died)."""
        if verdict == Verdict.ERROR:
            worker.process.join(timeout=1.0)  # reap it, so that its exit code can be reported
        if not worker.in_flight:
            if not worker.ready:
                raise RuntimeError(f"replacement verifier worker failed to start (exit code {worker.process.exitcode})")
            self._replace(worker, pending)  # died while idle: replace before it is sent anything
            return
        index = worker.in_flight[0]
        latencies[index] = now - worker.head_started_at
        error = None if verdict == Verdict.TIMEOUT else f"worker died with exit code {worker.process.exitcode}"
        if error:
            logger.error("verifier %s on item %d", error, index)
        outcomes[index] = VerifyOutcome(verdict, self._answer_of(jobs[index]), latencies[index], error=error)
        self._replace(worker, pending)

    def _answer_of(self, job: Job) -> str | None:
        """The answer a killed job was judging (extraction is linear-time, safe in the caller)."""
        kind, _, second = job
        return extract_answer(second, fallback=self.config.answer_fallback) if kind == "verify" else second
