"""Every GSM8K-test and MATH500 reference verifies CORRECT against itself written as \\boxed{...}, via the pool.

No exceptions were needed: all 1319 + 500 references pass with math-verify 0.9.0.
"""

from pathlib import Path

import pytest

from cooper_openrlhf.data.benchmarks import load_benchmark
from cooper_openrlhf.verify.pool import VerifierPool
from cooper_openrlhf.verify.rule import Verdict

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
    # The extractor must hand math-verify exactly the reference (balanced braces, \{ \} sets, matrices).
    # The one MATH500 reference with a thousands comma ("58,500") is normalised to "58500".
    mismatched = [(p.reference, x) for p, x in zip(problems, result.extracted) if x != p.reference]
    assert mismatched == [("58,500", "58500")]
