"""The worker side of `VerifierPool`: the process main loop and the parent's handle on one worker.

Messages over the worker's pipe:

- parent -> worker: one job ``(index, kind, left, right)`` (kinds: `JOB_FUNCTIONS`), or None to stop;
- worker -> parent: `READY` once warmed up, then ``(index, VerifyOutcome)`` for each job.

A worker runs one job at a time and never decides its own deadline: the parent kills it.
"""

import logging
import signal
import time
from multiprocessing.connection import Connection

from cooper_openrlhf.verify.rule import RuleVerifierConfig, Verdict, VerifyOutcome, equivalence_outcome, verify_one

logger = logging.getLogger(__name__)


# Job kinds a worker can run: name -> function(left, right, config) -> VerifyOutcome.
JOB_FUNCTIONS = {"verify": verify_one, "equivalent": equivalence_outcome}
READY = "ready"
# Imported once by the fork server so that a replacement worker starts in well under a second.
PRELOAD_MODULES = ["sympy", "latex2sympy2_extended", "math_verify", "cooper_openrlhf.verify.rule"]


def worker_main(conn: Connection, config: RuleVerifierConfig) -> None:
    """Serve jobs from `conn` until it sends None or closes."""
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    verify_one("1", "\\boxed{\\frac{2}{2}}", config)  # warm-up: imports sympy/antlr, so no deadline pays for it
    conn.send(READY)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        index, kind, left, right = message
        start = time.perf_counter()
        try:
            outcome = JOB_FUNCTIONS[kind](left, right, config)
        except Exception as exc:
            logger.warning("verifier worker raised on a %s job", kind, exc_info=True)
            answer = right if kind != "verify" else None
            outcome = VerifyOutcome(Verdict.ERROR, answer, time.perf_counter() - start, repr(exc))
        conn.send((index, outcome))


class WorkerHandle:
    """The parent's view of one worker: process, pipe end, and the job it runs.

    job: (batch index, monotonic time it was sent) of the job the worker runs, None while idle. A
        worker is sent a job only when idle, so it starts the job as it arrives: the deadline clock
        starts at the send.
    """

    def __init__(self, context, config: RuleVerifierConfig):
        self.conn, child_conn = context.Pipe(duplex=True)
        self.process = context.Process(target=worker_main, args=(child_conn, config), daemon=True)
        self.launched_at = time.monotonic()
        self.process.start()
        child_conn.close()
        self.ready = False
        self.job: tuple[int, float] | None = None

    def send(self, index: int, kind: str, left: str, right: str) -> None:
        self.conn.send((index, kind, left, right))
        self.job = (index, time.monotonic())

    def kill(self) -> None:
        """SIGKILL (if alive), reap, close the pipe."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()
