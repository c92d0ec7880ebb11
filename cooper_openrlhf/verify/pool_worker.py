"""The worker side of `VerifierPool`: the process main loop, and the parent's handle on one worker.

A worker reads ``(kind, a, b)`` jobs from its end of a duplex `Pipe` (a Unix socket pair), runs
them one after the other and sends one `VerifyOutcome` back per job, in order. It never decides
its own deadline: the parent kills it.
"""

import logging
import signal
import time
from collections import deque
from multiprocessing.connection import Connection

from cooper_openrlhf.verify.rule import RuleVerifierConfig, Verdict, VerifyOutcome, equivalence_outcome, verify_one

logger = logging.getLogger(__name__)

# Job kinds a worker can run: name -> function(str, str, config) -> VerifyOutcome.
JOB_FUNCTIONS = {"verify": verify_one, "equivalent": equivalence_outcome}
READY = "ready"
# Imported once by the fork server so that a replacement worker starts in well under a second.
PRELOAD_MODULES = ["sympy", "latex2sympy2_extended", "math_verify", "cooper_openrlhf.verify.rule"]

Job = tuple[str, str, str]


def worker_main(conn: Connection, config: RuleVerifierConfig) -> None:
    """Serve jobs from `conn` until it sends None or closes."""
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    verify_one("1", "\\boxed{\\frac{2}{2}}", config)  # warm-up: imports sympy/antlr, fills caches
    conn.send(READY)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        kind, first, second = job
        try:
            outcome = JOB_FUNCTIONS[kind](first, second, config)
        except Exception as exc:
            logger.warning("verifier worker raised on a %s job", kind, exc_info=True)
            outcome = VerifyOutcome(Verdict.ERROR, None, 0.0, error=repr(exc))
        conn.send(outcome)


class WorkerHandle:
    """The parent's view of one worker: process, pipe end, and the batch items sent to it.

    in_flight: batch indices sent and not yet answered, oldest first. The worker runs them in
        order, so the oldest is the one running, since `head_started_at` (monotonic seconds:
        its dispatch, or the arrival of the previous result).
    """

    def __init__(self, context, config: RuleVerifierConfig):
        self.conn, child_conn = context.Pipe(duplex=True)
        self.process = context.Process(target=worker_main, args=(child_conn, config), daemon=True)
        self.process.start()
        child_conn.close()
        self.ready = False
        self.launched_at = time.monotonic()
        self.in_flight: deque[int] = deque()
        self.head_started_at = 0.0

    def send(self, index: int, job: Job) -> None:
        self.conn.send(job)
        if not self.in_flight:
            self.head_started_at = time.monotonic()
        self.in_flight.append(index)

    def finish_head(self) -> int:
        """Pop the item whose result just arrived; the next one (if any) starts now."""
        index = self.in_flight.popleft()
        self.head_started_at = time.monotonic()
        return index

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()
