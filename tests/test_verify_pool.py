"""VerifierPool: order and counts, hard deadlines on pathological inputs, recovery, threads and asyncio."""

import asyncio
import os
import signal
import threading
import time

import pytest

from cooper_openrlhf.verify.pool import VerifierPool
from cooper_openrlhf.verify.rule import RuleVerifierConfig, Verdict

DEADLINE_S = 3.0
SLACK_S = 1.5  # dispatch, kill and pipe overhead on a loaded 2-core machine


@pytest.fixture(scope="module")
def pool():
    # 1 s math-verify alarms keep the pathological cases short; the 3 s deadline stays the hard bound.
    config = RuleVerifierConfig(parse_timeout_s=1, compare_timeout_s=1)
    with VerifierPool(num_workers=2, deadline_s=DEADLINE_S, config=config) as shared_pool:
        yield shared_pool


def assert_serves(pool: VerifierPool) -> None:
    result = pool.verify_batch(["\\frac{1}{2}", "7", "3"], ["\\boxed{0.5}", "#### 8", "\\boxed{3}"])
    assert result.verdicts == [Verdict.CORRECT, Verdict.INCORRECT, Verdict.CORRECT]


def test_results_in_input_order_with_counts(pool):
    references = [str(i) for i in range(40)]
    completions = [f"\\boxed{{{i if i % 3 else i + 1}}}" for i in range(40)]
    completions[5] = "nothing to see"
    result = pool.verify_batch(references, completions)
    expected = [Verdict.CORRECT if i % 3 else Verdict.INCORRECT for i in range(40)]
    expected[5] = Verdict.NO_ANSWER
    assert result.verdicts == expected
    assert result.extracted[1] == "1" and result.extracted[5] is None
    assert result.counts == {Verdict.CORRECT: 25, Verdict.INCORRECT: 14, Verdict.NO_ANSWER: 1}
    assert result.wall_seconds > 0


def test_empty_batch_and_bad_input(pool):
    assert pool.verify_batch([], []).outcomes == []
    with pytest.raises(ValueError, match="2 references but 1"):
        pool.verify_batch(["1", "2"], ["\\boxed{1}"])
    with pytest.raises(TypeError, match="item 1"):
        pool.verify_batch(["1", 2], ["a", "b"])
    assert_serves(pool)  # a rejected batch leaves the pool usable


PATHOLOGICAL = {
    "tower of powers": "\\boxed{9^{9^{9^{9}}}}",
    "huge power": "\\boxed{10^{10^{9}}}",
    "nested braces": "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
    "nested fractions": "\\boxed{" + "\\frac{" * 2000 + "1}{2}" * 2000 + "}",
    "long sum": "\\boxed{" + "1+" * 30000 + "1}",
    "100 KB of text": "lorem ipsum " * 8500,
    "100 KB of unclosed boxes": "\\boxed{" * 15000,
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_inputs_finish_within_the_deadline(pool, name):
    start = time.monotonic()
    result = pool.verify_batch(["1"], [PATHOLOGICAL[name]])
    assert time.monotonic() - start < DEADLINE_S + SLACK_S
    assert result.verdicts[0] in (Verdict.TIMEOUT, Verdict.NO_ANSWER, Verdict.INCORRECT)
    assert_serves(pool)


def test_hard_deadline_kills_a_stuck_worker_and_replaces_it():
    # math-verify's own alarms set far beyond the deadline: only the pool's kill can end the item.
    config = RuleVerifierConfig(parse_timeout_s=600, compare_timeout_s=600)
    with VerifierPool(num_workers=2, deadline_s=1.5, config=config) as pool:
        start = time.monotonic()
        result = pool.verify_batch(["1", "2", "3"], [PATHOLOGICAL["tower of powers"], "\\boxed{2}", "\\boxed{3}"])
        assert time.monotonic() - start < 1.5 + SLACK_S
        assert result.verdicts == [Verdict.TIMEOUT, Verdict.CORRECT, Verdict.CORRECT]
        assert result.extracted[0] == "9^{9^{9^{9}}}"  # a killed item still reports what it judged
        assert 1.5 <= result.latency_seconds[0] < 1.5 + SLACK_S
        assert pool.workers_replaced == 1
        assert_serves(pool)


def test_frozen_workers_are_killed_and_the_batch_completes():
    with VerifierPool(num_workers=2, deadline_s=1.0) as pool:
        for pid in pool.worker_pids:
            os.kill(pid, signal.SIGSTOP)  # stuck in a way no alarm can end
        result = pool.verify_batch(["1", "2", "3"], ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"])
        # Worker 0 runs item 0 with item 1 queued behind it, worker 1 runs item 2. Both are killed
        # at the deadline; item 1 never started, so it is re-run on a fresh worker.
        assert result.verdicts == [Verdict.TIMEOUT, Verdict.CORRECT, Verdict.TIMEOUT]
        assert pool.workers_replaced == 2
        assert_serves(pool)


def test_a_worker_that_dies_while_idle_is_replaced(pool):
    dead_pid = pool.worker_pids[0]
    os.kill(dead_pid, signal.SIGKILL)
    pool._workers[0].process.join()  # white-box: be sure it is dead before the next batch
    assert_serves(pool)
    assert dead_pid not in pool.worker_pids


def test_calls_from_threads(pool):
    results = [None] * 4

    def run(slot):
        results[slot] = pool.verify_batch([str(slot)], [f"\\boxed{{{slot}}}"]).verdicts

    threads = [threading.Thread(target=run, args=(slot,)) for slot in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [[Verdict.CORRECT]] * 4


def test_calls_from_asyncio(pool):
    async def main():
        ticks = 0

        async def ticker():  # the event loop must keep running while a batch is verified
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        first, second = await asyncio.gather(
            pool.averify_batch(["1"], [PATHOLOGICAL["tower of powers"]]),
            pool.averify_batch(["2"], ["\\boxed{2}"]),
        )
        tick_task.cancel()
        return first, second, ticks

    first, second, ticks = asyncio.run(main())
    assert first.verdicts[0] in (Verdict.TIMEOUT, Verdict.INCORRECT)
    assert second.verdicts == [Verdict.CORRECT]
    assert ticks > 10


def test_close_is_idempotent_and_final():
    pool = VerifierPool(num_workers=1, deadline_s=2.0)
    pids = pool.worker_pids
    pool.close()
    pool.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):  # reaped, not a zombie
            os.kill(pid, 0)
    with pytest.raises(RuntimeError, match="closed"):
        pool.verify_batch(["1"], ["\\boxed{1}"])


def test_fork_is_refused():
    with pytest.raises(ValueError, match="forkserver"):
        VerifierPool(num_workers=1, start_method="fork")
