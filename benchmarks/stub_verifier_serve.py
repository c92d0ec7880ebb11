"""`cli.serve` whose rule verifier answers at once without verifying: what the verification costs a request.

    python benchmarks/stub_verifier_serve.py <cli.serve arguments>

`serve_throughput.py`'s `cooper_stub_verifier` server. Every other part of the service (HTTP app, groups, RM
batching and forward, the verifier's lanes and batcher) is the real one; only `VerifierPool` is replaced, by a pool
whose every verdict is "correct" and costs nothing. A benchmark's baseline, never a reward service: its rewards
are not verified.
"""

import sys

import cooper_openrlhf.verify.pool as verifier_pool
from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome


class InstantVerifierPool:
    """`VerifierPool`'s interface as `cli.serve` uses it, with no worker process and no verification."""

    worker_pids: list[int] = []
    workers_replaced = 0

    def __init__(self, *args, **kwargs):
        pass

    def verify_batch(self, references: list[str], completions: list[str]) -> verifier_pool.BatchResult:
        outcomes = [VerifyOutcome(Verdict.CORRECT, reference, 0.0) for reference in references]
        return verifier_pool.BatchResult(outcomes, {Verdict.CORRECT: len(outcomes)})

    def close(self) -> None:
        pass


if __name__ == "__main__":
    if "--learn" in sys.argv or "--replicas" in sys.argv:  # pairs need real verdicts; replicas verify elsewhere
        sys.exit("stub_verifier_serve.py: a scoring baseline only; --learn and --replicas are not for it")
    verifier_pool.VerifierPool = InstantVerifierPool  # build_service imports it from the module when it runs
    from cooper_openrlhf.cli.serve import main

    sys.exit(main(sys.argv[1:]))
