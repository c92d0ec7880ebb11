"""VerifierPool: rule verification in worker processes, with a hard per-item deadline.

One `multiprocessing.Process` per worker, each with its own `Pipe`, each running one item at a
time (`pool_worker`). The dispatcher runs in the calling thread: it sends the next item to every
idle worker and waits on the busy workers' pipes and process sentinels with
`multiprocessing.connection.wait`, never longer than the nearest deadline. A worker still busy at
its item's deadline (counted from the send) is SIGKILLed and replaced; the item gets TIMEOUT. A
worker that dies on its own (segfault, OOM kill) is replaced too; its item gets ERROR. Either way
the item's `extracted` is None: the answer is found inside the worker.

Why processes: math-verify's `signal.alarm` cannot stop a single long C call and cannot be used
outside a main thread, while the callers are threads, asyncio loops (through `asyncio.to_thread`)
and Ray actors. Killing a process works everywhere and needs no signal handler in the caller.

Throughput: a Cooper step verifies a few hundred items next to minutes of generation, so items go
one message each way with no batching on the wire; `benchmarks/verifier_throughput.py` measures
the pool against serial verification (figures in docs/verifier_pool.md).

Workers start with the "forkserver" method where available (else "spawn"): never plain fork,
since the caller may hold threads and locks. They import math-verify and warm sympy up once,
before they take their first item, so no deadline pays for imports. As with any spawn or
forkserver pool, a script that makes one must guard its entry point with
``if __name__ == "__main__":``.

Thread safety: batches are served one at a time (a lock); a batch from another thread waits.
Results come back in input order.
"""

import logging
import multiprocessing as mp
import os
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from cooper_openrlhf.verify.extract import normalize_answer
from cooper_openrlhf.verify.pool_worker import PRELOAD_MODULES, READY, WorkerHandle
from cooper_openrlhf.verify.rule import RuleVerifierConfig, Verdict, VerifyOutcome, equivalence_from_verdict

logger = logging.getLogger(__name__)


@dataclass
class BatchResult:
    """Outcomes of one batch, in input order, with counts per verdict and wall-clock seconds.

    latency_seconds[i]: from when item i was sent to a worker until its verdict arrived (for a
    killed item, until the dispatcher noticed its deadline or death).
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
    """One batch being served: its job kind, per item a left and a right string, the queue, results so far.

    verify: left = reference, right = completion; equivalent: left = answer_a, right = answer_b.
    """

    def __init__(self, kind: str, lefts: list[str], rights: list[str]):
        self.kind = kind
        self.lefts = lefts
        self.rights = rights
        self.pending: deque[int] = deque(range(len(lefts)))
        self.outcomes: list[VerifyOutcome | None] = [None] * len(lefts)
        self.latencies = [0.0] * len(lefts)


class VerifierPool:
    """A reusable pool of verifier processes.

    num_workers: defaults to the number of CPUs this process may use.
    deadline_s: hard limit per item, from its send to a worker to its result (seconds, float).
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
        try:
            while not all(worker.ready for worker in self._workers):
                self._wait_for_event(None)
        except BaseException:
            self._shutdown()
            raise

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
    def _run(self, batch: _Batch) -> BatchResult:
        with self._lock:
            if self._closed:
                raise RuntimeError("VerifierPool is closed")
            start = time.perf_counter()
            try:
                while batch.pending or any(worker.job is not None for worker in self._workers):
                    self._dispatch(batch)
                    self._wait_for_event(batch)
            except BaseException:
                # Workers may hold items of this batch: the pool cannot serve another one safely.
                logger.error("verifier batch aborted; closing the pool")
                self._shutdown()
                raise
            counts = Counter(outcome.verdict for outcome in batch.outcomes)
            return BatchResult(batch.outcomes, dict(counts), time.perf_counter() - start, batch.latencies)

    def _dispatch(self, batch: _Batch) -> None:
        """The next queued item to every idle worker."""
        for worker in self._workers:
            if batch.pending and worker.ready and worker.job is None:
                index = batch.pending.popleft()
                try:
                    worker.send(index, batch.kind, batch.lefts[index], batch.rights[index])
                except (BrokenPipeError, ConnectionResetError):  # it died while idle: nothing of it to charge
                    logger.error("verifier worker's pipe broke (exit code %s); replacing it", worker.process.exitcode)
                    batch.pending.appendleft(index)
                    worker.kill()
                    self._replace(worker)

    def _wait_for_event(self, batch: _Batch | None) -> None:
        """Wait for the next event (a result, a death, a ready worker or a deadline) and handle it."""
        watched = [w for w in self._workers if w.job is not None or not w.ready]
        if not watched:
            return
        deadlines = [w.job[1] + self.deadline_s if w.ready else w.launched_at + self.startup_timeout_s for w in watched]
        timeout = max(0.0, min(deadlines) - time.monotonic())
        ready = set(wait([w.conn for w in watched] + [w.process.sentinel for w in watched], timeout=timeout))
        now = time.monotonic()
        for worker in watched:
            if not worker.ready:
                if worker.conn in ready or worker.process.sentinel in ready:
                    message = self._receive(worker)
                    if message != READY:
                        worker.kill()  # reaped, so that its exit code is known
                        raise RuntimeError(
                            f"verifier worker failed to start (exit code {worker.process.exitcode}, got {message!r})"
                        )
                    worker.ready = True
                elif now >= worker.launched_at + self.startup_timeout_s:
                    raise TimeoutError(f"verifier worker did not start within {self.startup_timeout_s}s")
                continue
            index, sent_at = worker.job
            if worker.conn in ready:
                message = self._receive(worker)
                if message is not None:
                    result_index, outcome = message
                    if result_index != index:
                        raise RuntimeError(f"verifier worker answered item {result_index} while item {index} was due")
                    self._finish(batch, worker, outcome, now)
                    continue
            if worker.conn in ready or worker.process.sentinel in ready:  # died, or its pipe broke
                worker.kill()
                error = f"worker died with exit code {worker.process.exitcode}"
                logger.error("verifier %s on item %d", error, index)
                self._finish(batch, worker, VerifyOutcome(Verdict.ERROR, None, now - sent_at, error), now)
                self._replace(worker)
            elif now >= sent_at + self.deadline_s:
                worker.kill()
                logger.warning("verifier item %d passed its %.1fs deadline: killed", index, self.deadline_s)
                self._finish(batch, worker, VerifyOutcome(Verdict.TIMEOUT, None, now - sent_at), now)
                self._replace(worker)

    @staticmethod
    def _receive(worker: WorkerHandle):
        """The worker's next message, or None when its pipe is closed (the worker is dead or dying)."""
        try:
            return worker.conn.recv()
        except (EOFError, OSError):
            return None

    @staticmethod
    def _finish(batch: _Batch, worker: WorkerHandle, outcome: VerifyOutcome, now: float) -> None:
        index, sent_at = worker.job
        batch.outcomes[index] = outcome
        batch.latencies[index] = now - sent_at
        worker.job = None

    def _replace(self, worker: WorkerHandle) -> None:
        """A fresh worker in the place of `worker` (killed already); it serves once READY."""
        self._workers[self._workers.index(worker)] = WorkerHandle(self._context, self.config)
        self.workers_replaced += 1
