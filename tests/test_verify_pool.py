"""VerifierPool: order and counts, hard deadlines on pathological inputs, recovery, threads and asyncio.

A hung item among others is killed at its own deadline, and every other item still gets its verdict.
"""

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


def test_interleaved_references_keep_input_order(pool):
    # Items of several references interleaved, served by two workers: results must come back in input order.
    references = ["\\frac{1}{2}", "7", "x^2"] * 12
    answers = {"\\frac{1}{2}": ["\\frac{2}{4}", "0.25"], "7": ["7", "8"], "x^2": ["x^{2}", "x^3"]}
    completions = [f"\\boxed{{{answers[r][(i // 3) % 2]}}}" for i, r in enumerate(references)]
    result = pool.verify_batch(references, completions)
    assert result.verdicts == [Verdict.CORRECT if (i // 3) % 2 == 0 else Verdict.INCORRECT for i in range(36)]
    assert result.extracted == [c[len("\\boxed{") : -1] for c in completions]


def test_equivalence_batch(pool):
    verdicts = pool.equivalence_batch(["\\frac{1}{2}", "2", "1", "x+1"], ["0.5", "3", "", "1+x"])
    assert verdicts == [True, False, None, True]


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
    # Extraction is linear in the nesting (it used to rescan level by level: ~12 s, then RecursionError);
    # it still runs in a worker, never in the dispatcher, and the boxed answer is found.
    "100 KB of nested boxes": "\\boxed{" * 12500 + "1" + "}" * 12500,
}
UNDECIDED = (Verdict.TIMEOUT, Verdict.NO_ANSWER, Verdict.INCORRECT)


def acceptable_verdicts(name: str) -> tuple[Verdict, ...]:
    # The nested boxes hold the reference itself: unwrapped, it is simply correct.
    return (Verdict.CORRECT,) if name == "100 KB of nested boxes" else UNDECIDED


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_inputs_finish_within_the_deadline(pool, name):
    start = time.monotonic()
    result = pool.verify_batch(["1"], [PATHOLOGICAL[name]])
    assert time.monotonic() - start < DEADLINE_S + SLACK_S
    assert result.verdicts[0] in acceptable_verdicts(name)
    assert_serves(pool)


def test_a_batch_mixing_every_pathological_input_with_normal_items(pool):
    names = sorted(PATHOLOGICAL)
    references, completions = [], []
    for k, name in enumerate(names):
        references += ["1", str(k), "\\frac{1}{2}"]
        completions += [PATHOLOGICAL[name], f"#### {k}", "\\boxed{0.5}"]
    start = time.monotonic()
    result = pool.verify_batch(references, completions)
    # Each pathological item costs at most a deadline, and the 2 workers share them.
    assert time.monotonic() - start < len(names) * DEADLINE_S / 2 + SLACK_S
    assert max(result.latency_seconds) < DEADLINE_S + SLACK_S
    for k, name in enumerate(names):
        assert result.verdicts[3 * k] in acceptable_verdicts(name), name
        assert result.verdicts[3 * k + 1 : 3 * k + 3] == [Verdict.CORRECT, Verdict.CORRECT], name
    assert_serves(pool)


def slow_sum(k: int) -> str:
    """A completion that math-verify parses in ~0.4 s, and rejects. Distinct per k (math-verify caches parses)."""
    return "\\boxed{" + "1+" * 1500 + f"{k + 2}}}"


def test_a_hung_item_among_others_is_killed_at_its_own_deadline():
    # One worker runs the slow items, the hung one and the quick ones after it in turn. math-verify's alarms are off (600 s).
    deadline = 1.5
    config = RuleVerifierConfig(parse_timeout_s=600, compare_timeout_s=600)
    slow = [slow_sum(k) for k in range(5)]  # ~2 s together: more than one deadline
    quick = [f"\\boxed{{{k}}}" for k in range(2, 16)]
    completions = slow + [PATHOLOGICAL["tower of powers"]] + quick
    references = ["1"] * 6 + [str(k) for k in range(2, 16)]
    with VerifierPool(num_workers=1, deadline_s=deadline, config=config) as pool:
        result = pool.verify_batch(references, completions)
        # The deadline clock of each item starts when the worker gets it, not when the batch starts.
        assert result.verdicts == [Verdict.INCORRECT] * 5 + [Verdict.TIMEOUT] + [Verdict.CORRECT] * 14
        assert deadline <= result.latency_seconds[5] < deadline + SLACK_S
        assert pool.workers_replaced == 1
        assert_serves(pool)


def test_a_worker_killed_mid_batch_gives_error_for_its_item_only():
    config = RuleVerifierConfig(parse_timeout_s=600, compare_timeout_s=600)
    with VerifierPool(num_workers=1, deadline_s=60.0, config=config) as pool:
        # The worker hangs on item 2 until it is killed from outside.
        quick = [f"\\boxed{{{k}}}" for k in range(8)]
        completions = quick[:2] + [PATHOLOGICAL["tower of powers"]] + quick[3:]
        killer = threading.Timer(1.0, os.kill, (pool.worker_pids[0], signal.SIGKILL))
        killer.start()
        start = time.monotonic()
        result = pool.verify_batch([str(k) for k in range(8)], completions)
        killer.join()
        assert time.monotonic() - start < 1.0 + SLACK_S
        assert result.verdicts == [Verdict.CORRECT] * 2 + [Verdict.ERROR] + [Verdict.CORRECT] * 5
        assert "exit code -9" in result.outcomes[2].error
        assert pool.workers_replaced == 1
        assert_serves(pool)


def test_hard_deadline_kills_a_stuck_worker_and_replaces_it():
    # math-verify's own alarms set far beyond the deadline: only the pool's kill can end the item.
    config = RuleVerifierConfig(parse_timeout_s=600, compare_timeout_s=600)
    with VerifierPool(num_workers=2, deadline_s=1.5, config=config) as pool:
        start = time.monotonic()
        result = pool.verify_batch(["1", "2", "3"], [PATHOLOGICAL["tower of powers"], "\\boxed{2}", "\\boxed{3}"])
        assert time.monotonic() - start < 1.5 + SLACK_S
        assert result.verdicts == [Verdict.TIMEOUT, Verdict.CORRECT, Verdict.CORRECT]
        assert 1.5 <= result.latency_seconds[0] < 1.5 + SLACK_S
        assert pool.workers_replaced == 1
        assert_serves(pool)


def test_frozen_workers_are_killed_and_the_batch_completes():
    with VerifierPool(num_workers=2, deadline_s=1.0) as pool:
        for pid in pool.worker_pids:
            os.kill(pid, signal.SIGSTOP)  # stuck in a way no alarm can end
        result = pool.verify_batch(["1", "2", "3"], ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"])
        # Workers 0 and 1 get items 0 and 1 and are killed at the deadline; item 2 runs on a fresh worker.
        assert result.verdicts == [Verdict.TIMEOUT, Verdict.TIMEOUT, Verdict.CORRECT]
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
            asyncio.to_thread(pool.verify_batch, ["1"], [PATHOLOGICAL["tower of powers"]]),
            asyncio.to_thread(pool.verify_batch, ["2"], ["\\boxed{2}"]),
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


@pytest.mark.slow
def test_from_a_ray_actor(ray_cluster):
    # Ray runs actor methods outside the main thread of its worker (no signal.alarm there).
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class PoolOwner:
        def __init__(self):
            config = RuleVerifierConfig(parse_timeout_s=600, compare_timeout_s=600)
            self.pool = VerifierPool(num_workers=2, deadline_s=1.5, config=config)

        def verify(self, references, completions):
            result = self.pool.verify_batch(references, completions)
            return [verdict.value for verdict in result.verdicts], self.pool.workers_replaced

        def close(self):
            self.pool.close()

    owner = PoolOwner.remote()
    try:
        completions = ["\\boxed{0.5}", PATHOLOGICAL["tower of powers"], "#### 8", "the answer is 3"]
        verdicts, replaced = ray.get(owner.verify.remote(["\\frac{1}{2}", "1", "7", "3"], completions), timeout=120)
        assert verdicts == ["correct", "timeout", "incorrect", "correct"]
        assert replaced == 1
        ray.get(owner.close.remote(), timeout=30)
    finally:
        ray.kill(owner)
