"""The intra-op thread count of a CPU forward (`runtime/cpu_threads.py`): each batch size runs on the count that ran
it fastest, the choice follows a change of load, the caller's count is left as it was, the RM scorer uses it with
unchanged logits, and the service's learner keeps every thread whatever the scorer chose."""

import pytest
import torch

from cooper_openrlhf.runtime.cpu_threads import ThreadChoice


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _feed(choice: ThreadChoice, rows: int, seconds_per_row: dict[int, float], batches: int) -> list[int]:
    """Run `batches` batches of `rows` rows whose time on k threads is seconds_per_row[k] a row; the counts picked."""
    picked = []
    for _ in range(batches):
        threads = choice.pick(rows)
        choice.record(rows, threads, seconds_per_row[threads] * rows)
        picked.append(threads)
    return picked


def test_small_batches_run_on_one_thread_and_large_ones_on_all_when_that_is_faster():
    choice = ThreadChoice((1, 2), trials=3, recheck=8)
    small = _feed(choice, 1, {1: 1e-3, 2: 2e-3}, 40)
    large = _feed(choice, 64, {1: 4e-4, 2: 2.5e-4}, 40)
    # tried in turn, all threads first; all threads clearly faster (past CLEAR_MARGIN) decides after one trial each
    assert small[:6] == [2, 1] * 3 and large[:2] == [2, 1]
    assert small[6:].count(1) > 0.8 * len(small[6:]) and large[2:].count(2) > 0.8 * len(large[2:])
    assert choice.chosen() == {1: 1, 64: 2}
    # the other count is still tried now and then, so a change of load is seen
    assert 2 in small[6:] and 1 in large[2:]


def test_a_close_call_takes_every_trial_and_the_best_time_of_each():
    choice = ThreadChoice((1, 2), trials=3, recheck=1000)
    # one thread 10% faster, and the first forward (all threads) slow, as a first call is: the best of each decides
    times = iter([3e-3, 1e-3, 1.1e-3, 1e-3, 1.1e-3, 1e-3])
    picked = []
    for _ in range(6):
        threads = choice.pick(1)
        choice.record(1, threads, next(times))
        picked.append(threads)
    assert sorted(picked) == [1, 1, 1, 2, 2, 2] and choice.chosen() == {1: 1}


def test_the_choice_follows_the_load_when_the_other_count_becomes_faster():
    choice = ThreadChoice((1, 2), trials=3, recheck=4)
    _feed(choice, 8, {1: 1e-3, 2: 2e-3}, 20)
    assert choice.pick(8) == 1
    after = _feed(choice, 8, {1: 3e-3, 2: 2e-3}, 60)  # say the learner now takes a core's worth of the machine
    assert after[-8:].count(2) >= 6 and choice.chosen() == {8: 2}


def test_a_bucket_not_yet_tried_takes_what_a_tried_neighbour_implies_without_trials():
    # more threads pay off more as batches grow: all threads winning on one row means all threads on 64 rows
    choice = ThreadChoice((1, 2), trials=3, recheck=1000)
    _feed(choice, 1, {1: 2e-3, 2: 1e-3}, 6)
    assert _feed(choice, 64, {1: 1e-3, 2: 5e-4}, 5) == [2] * 5
    # and one thread winning on 64 rows means one thread below
    choice = ThreadChoice((1, 2), trials=3, recheck=1000)
    _feed(choice, 64, {1: 1e-3, 2: 2e-3}, 6)
    assert _feed(choice, 4, {1: 1e-3, 2: 2e-3}, 5) == [1] * 5
    # one thread winning on one row implies nothing above: 64 rows are tried on both
    choice = ThreadChoice((1, 2), trials=3, recheck=1000)
    _feed(choice, 1, {1: 1e-3, 2: 2e-3}, 6)
    assert _feed(choice, 64, {1: 1e-3, 2: 5e-4}, 6) == [2, 1, 2, 2, 2, 2]


def test_one_choice_does_nothing():
    choice = ThreadChoice((1,))
    assert [choice.pick(rows) for rows in (1, 64)] == [1, 1]


def test_the_body_runs_on_the_picked_count_and_the_callers_count_comes_back(two_threads):
    choice = ThreadChoice((1, 2), trials=1)
    seen = []
    for _ in range(4):
        with choice.running(3) as threads:
            seen.append((threads, torch.get_num_threads()))
        assert torch.get_num_threads() == 2
    assert all(threads == inside for threads, inside in seen) and {t for t, _ in seen} == {1, 2}


def test_the_rm_scorer_chooses_per_batch_with_the_logits_of_a_fixed_count(model_dir, two_threads):
    from cooper_openrlhf.rm.model import load_rm
    from cooper_openrlhf.rm.scorer import RMScorer

    model, tokenizer, version = load_rm(model_dir("tiny-qwen2-rm"))
    scorer = RMScorer(model, tokenizer, max_length=128, template_version=version, batch_size=16)
    assert scorer.threads is not None and scorer.threads.choices == (1, 2)
    items = [(0, f"What is {i} + 1?", str(i + 1), f"The answer is {i + 1}.") for i in range(16)]
    fixed = ThreadChoice((2,))
    scorer.threads, on_all = fixed, scorer.logits_of(items)
    scorer.threads = ThreadChoice((1, 2), trials=2)
    for _ in range(4):  # a lone request, timed on both counts
        assert scorer.logits_of(items[:1]) == pytest.approx(on_all[:1], abs=1e-4)
        assert torch.get_num_threads() == 2
    assert 1 in scorer.threads.chosen()
    for _ in range(4):
        assert scorer.logits_of(items) == pytest.approx(on_all, abs=1e-4)
        assert torch.get_num_threads() == 2


def test_a_bucket_decided_by_a_clear_margin_stays_decided_when_the_winner_slows_and_its_choice_follows():
    """CI beside other work once read no choice after a lone request's trials: the margin that had decided the
    bucket was gone once load slowed the winner's later forwards, and the bucket had reopened."""
    choice = ThreadChoice((1, 2), trials=2)
    picked, chosen = [], []
    # seconds a row: two threads fast, one thread clearly slower; then load slows the two-thread forwards
    for seconds in (1e-3, 2e-3, 1.9e-3, 2.5e-3, 2.5e-3, 1.5e-3):
        threads = choice.pick(1)
        choice.record(1, threads, seconds)
        picked.append(threads)
        chosen.append(choice.chosen())
    assert picked == [2, 1, 2, 2, 2, 1]
    assert chosen[1:] == [{1: 2}, {1: 2}, {1: 2}, {1: 1}, {1: 1}]


def test_the_services_learner_keeps_every_thread_whatever_the_scorer_left_as_the_default(two_threads, tmp_path):
    # torch.set_num_threads also sets the count a thread that has not yet run torch starts from; the learner's
    # thread starts lazily, so without its pin it would train on the count a lone request's forward had just set.
    from cooper_openrlhf.serve.metrics import ServiceLog
    from cooper_openrlhf.serve.service import RewardService, ServiceConfig

    service = RewardService(ServiceConfig(), scorer=type("S", (), {"logits_of": None})(), verify_lanes=[lambda r, c: []],
                            log=ServiceLog(str(tmp_path)))
    torch.set_num_threads(1)  # what a scoring thread's forward on one thread leaves as the default
    try:
        assert service._executor.submit(torch.get_num_threads).result() == 2
    finally:
        service._executor.shutdown()
