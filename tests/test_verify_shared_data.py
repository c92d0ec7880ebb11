"""Every GSM8K-test and MATH500 reference verifies CORRECT against itself written as \\boxed{...}, via the pool.

No exceptions were needed: all 1319 + 500 references pass with math-verify 0.9.0, and the answer
each outcome reports verifies equal to its reference.
"""

from pathlib import Path

import pytest

from cooper_openrlhf.data.benchmarks import load_benchmark
from cooper_openrlhf.verify.pool import VerifierPool
from cooper_openrlhf.verify.rule import Verdict, compare_answers

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

pytestmark = pytest.mark.shared_data


def load_problems():
    paths = {"gsm8k": SHARED_DATA / "gsm8k" / "test.jsonl", "math500": SHARED_DATA / "math500" / "test.jsonl"}
    missing = [str(path) for path in paths.values() if not path.is_file()]
    if missing:
        pytest.skip(f"shared benchmark data not found: {missing} (expected beside the checkout, as ../shared/data)")
    return [problem for name, path in paths.items() for problem in load_benchmark(name, path).records]


def test_every_reference_verifies_against_itself_boxed():
    problems = load_problems()
    assert len(problems) == 1319 + 500
    with VerifierPool(deadline_s=10.0) as pool:
        result = pool.verify_batch(
            [p.reference for p in problems],
            [f"Putting it all together, the result is \\boxed{{{p.reference}}}." for p in problems],
        )
    failures = [
        (p.source, p.index, p.reference, o.verdict.value, o.extracted)
        for p, o in zip(problems, result.outcomes)
        if o.verdict != Verdict.CORRECT
    ]
    assert failures == []
    # The answer each outcome reports (math-verify's normalised string, e.g. "\\dfrac" -> "\\frac")
    # must itself be the reference: reporting it loses nothing.
    unfaithful = [(p.reference, x) for p, x in zip(problems, result.extracted) if compare_answers(p.reference, x) != Verdict.CORRECT]
    assert unfaithful == []
