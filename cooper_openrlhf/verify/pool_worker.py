"""The worker side of `VerifierPool`: the process main loop, the wire format, and the parent's handle on one worker.

Wire format (plain tuples and str: they pickle several times faster than dataclasses and enums):

- parent -> worker: a chunk ``[(index, kind, left, right), ...]`` (kinds: `JOB_FUNCTIONS`),
  or None to stop;
- worker -> parent: ``(READY, epoch)`` once warmed up, then lists of results
  ``(index, verdict value, extracted, seconds, latency, error)``, in the order the jobs ran.

The worker runs a chunk's jobs in order and sends the results of a chunk when it is done, and
earlier, before starting a job, once its oldest unsent result is `FLUSH_S` old (so that a kill
loses little finished work). It never decides its own deadline: the parent kills it. So that the
parent knows which job is running and since when without a message per job, the worker
publishes, before each job, one shared 64-bit word (`encode_progress`): how many jobs it has
started (mod 2**16) and when the latest one started (microseconds since the epoch it sent with
READY). One aligned 8-byte store is atomic, so the parent never sees a count from one job with the
time of another.
"""

import ctypes
import logging
import signal
import time
from collections import deque
from multiprocessing.connection import Connection

from cooper_openrlhf.verify.rule import RuleVerifierConfig, equivalence_outcome, verify_one

logger = logging.getLogger(__name__)


# Job kinds a worker can run: name -> function(str, str, config) -> VerifyOutcome.
JOB_FUNCTIONS = {"verify": verify_one, "equivalent": equivalence_outcome}
READY = "ready"
# Imported once by the fork server so that a replacement worker starts in well under a second.
PRELOAD_MODULES = ["sympy", "latex2sympy2_extended", "math_verify", "cooper_openrlhf.verify.rule"]
FLUSH_S = 0.02  # results older than this are sent before the next job starts

_COUNT_BITS = 16  # jobs started, mod 2**16: the parent never has that many unanswered on one worker
_TIME_BITS = 64 - _COUNT_BITS  # microseconds since the worker's epoch: 2**48 us is 8.9 years
_TIME_MASK = (1 << _TIME_BITS) - 1
_COUNT_MODULUS = 1 << _COUNT_BITS

ChunkItem = tuple[int, str, str, str]  # (batch index, kind, left, right): left = reference or answer_a


def encode_progress(started: int, started_at_us: int) -> int:
    return ((started % _COUNT_MODULUS) << _TIME_BITS) | (started_at_us & _TIME_MASK)


def worker_main(conn: Connection, progress, config: RuleVerifierConfig) -> None:
    """Serve chunks from `conn` until it sends None or closes. `progress`: the shared word (c_uint64)."""
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    verify_one("1", "\\boxed{\\frac{2}{2}}", config)  # warm-up: imports sympy/antlr, fills caches
    # Progress times count from here. CLOCK_MONOTONIC is system-wide, so the parent compares them with its own.
    epoch = time.monotonic()
    conn.send((READY, epoch))
    monotonic = time.monotonic
    started = 0
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        results: list[tuple] = []
        flush_at = 0.0
        for index, kind, left, right in message:
            if results and monotonic() >= flush_at:
                conn.send(results)  # the next job might hang: do not hold finished work behind it
                results = []
            start = monotonic()
            started += 1
            progress.value = encode_progress(started, int((start - epoch) * 1e6))
            try:
                outcome = JOB_FUNCTIONS[kind](left, right, config)
            except Exception as exc:
                logger.warning("verifier worker raised on a %s job", kind, exc_info=True)
                result = (index, "error", right if kind != "verify" else None, 0.0, monotonic() - start, repr(exc))
            else:
                latency = monotonic() - start
                result = (index, outcome.verdict.value, outcome.extracted, outcome.seconds, latency, outcome.error)
            if not results:
                flush_at = monotonic() + FLUSH_S
            results.append(result)
        conn.send(results)


class WorkerHandle:
    """The parent's view of one worker: process, pipe end, shared progress word, and its unanswered items.

    in_flight: batch indices sent and not yet answered, in the order the worker runs them.
    answered: items this worker has answered since it started (results received).
    chunk_ends: for each chunk not fully answered, the value `answered` reaches when it is.
    mark: monotonic seconds of the last sign of life that restarts the deadline clock when no
        job is known to be running: a send to an idle worker, or a results message.
    """

    def __init__(self, context, config: RuleVerifierConfig):
        self.conn, child_conn = context.Pipe(duplex=True)
        self.progress = context.RawValue(ctypes.c_uint64, 0)
        self.process = context.Process(target=worker_main, args=(child_conn, self.progress, config), daemon=True)
        self.launched_at = time.monotonic()
        self.process.start()
        child_conn.close()
        self.ready = False
        self.epoch = 0.0  # the worker's monotonic clock at READY; progress times count from it
        self.in_flight: deque[int] = deque()
        self.answered = 0
        self.chunk_ends: deque[int] = deque()
        self.mark = 0.0

    def set_ready(self, message) -> bool:
        """Accept the worker's first message; False if it is not READY."""
        if not (isinstance(message, tuple) and len(message) == 2 and message[0] == READY):
            return False
        self.epoch = message[1]
        self.ready = True
        return True

    def send(self, items: list[ChunkItem], now: float) -> None:
        self.conn.send(items)
        if not self.in_flight:
            self.mark = now
        self.in_flight.extend(item[0] for item in items)
        self.chunk_ends.append(self.answered + len(self.in_flight))

    def take(self, index: int) -> None:
        """The result of the oldest unanswered item arrived; it must be `index`."""
        expected = self.in_flight.popleft()
        if expected != index:
            raise RuntimeError(f"verifier worker answered item {index} while item {expected} was due")
        self.answered += 1
        while self.chunk_ends and self.chunk_ends[0] <= self.answered:
            self.chunk_ends.popleft()

    def running(self) -> tuple[int, float] | None:
        """(position in `in_flight`, monotonic start) of the job running now, if one is known to run.

        From the shared word: the worker has started `started` jobs; when that is more than it has
        answered, job number `started` (the last one started) runs, or finished unreported.
        """
        word = self.progress.value
        unreported = ((word >> _TIME_BITS) - self.answered) % _COUNT_MODULUS
        if unreported == 0 or unreported > len(self.in_flight):
            return None  # between jobs; (more than sent cannot happen: a stale word, read as none)
        return unreported - 1, self.epoch + (word & _TIME_MASK) / 1e6

    def current(self) -> tuple[int, float]:
        """(batch index, deadline clock start) of the item this worker is on; needs `in_flight`.

        The running item, timed from its start (or from the last results, if later); when none is
        known to run (between items, or frozen before starting one), the oldest unanswered item,
        timed from the last sign of life.
        """
        running = self.running()
        if running is None:
            return self.in_flight[0], self.mark
        position, started_at = running
        return self.in_flight[position], max(self.mark, started_at)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()

    def drain(self) -> list:
        """Complete result messages still buffered from a dead worker; then close the pipe."""
        messages = []
        try:
            while self.conn.poll(0):
                messages.append(self.conn.recv())
        except (EOFError, OSError):
            pass  # end of stream, or a message cut short by the kill
        self.conn.close()
        return messages
