"""The reward service's pure parts: the protocol and prompt splitting (on the real Qwen2 and SmolLM2 chat templates),
the reward modes, GRPO groups pinned to RM versions, and the batcher (batching, waiting, errors, lanes)."""

import asyncio
import threading
import time

import pytest
import torch

from cooper_openrlhf.serve.batcher import MicroBatcher
from cooper_openrlhf.serve.contract import Scored
from cooper_openrlhf.serve.groups import (RETRY_WINDOW_S, GroupTracker, ScoredSample, fingerprint, groups_from_dicts,
                                          groups_to_dicts)
from cooper_openrlhf.serve.protocol import PromptSplitter, RequestError, Sample, build_response, parse_request
from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome

QUESTION = "Tom has 3 apples and buys 4 more.\nHow many apples does he have?"


# ------------------------------------------------------------------------------------------------ protocol
def test_parse_request_accepts_openrlhfs_body_and_numeric_labels():
    body = {"query": ["p q"], "prompts": ["p"], "labels": [7]}
    assert parse_request(body, 8) == (["p q"], ["p"], ["7"])
    assert parse_request({"query": "a", "prompts": "b", "labels": "c"}, 8) == (["a"], ["b"], ["c"])


@pytest.mark.parametrize("body, status, words", [
    ([1, 2], 400, "JSON object"),
    ({"prompts": ["p"], "labels": ["1"]}, 400, "'query' is missing"),
    ({"query": ["q"], "prompts": ["p", "p"], "labels": ["1"]}, 400, "disagree in length"),
    ({"query": ["q"], "prompts": [3], "labels": ["1"]}, 400, "'prompts'[0] must be a string"),
    ({"query": ["q"], "prompts": ["p"], "labels": [" "]}, 400, "'labels'[0] is empty"),
    ({"query": [], "prompts": [], "labels": []}, 400, "empty"),
    ({"query": ["q"] * 9, "prompts": ["p"] * 9, "labels": ["1"] * 9}, 413, "at most 8"),
])
def test_parse_request_names_the_field_of_a_bad_body(body, status, words):
    with pytest.raises(RequestError, match=words.replace("[", r"\[").replace("]", r"\]")) as info:
        parse_request(body, 8)
    assert info.value.status == status


def test_build_response_has_one_value_per_sample_everywhere():
    assert build_response([0.25, 1], {"cooper/x": [1, 0]}) == {
        "rewards": [0.25, 1.0], "scores": [0.25, 1.0], "extra_logs": {"cooper/x": [1.0, 0.0]}}


@pytest.mark.parametrize("name", ["tiny-qwen2-policy", "smollm2-135m-instruct"])
def test_splitter_recovers_question_and_completion_from_openrlhfs_strings(model_dir, name):
    """As OpenRLHF builds them: prompt = apply_chat_template (preprocess_data), query = decode(prompt ids + response
    ids, skip_special_tokens=False); the completion is what the trainer's own decode would give."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir(name))
    splitter = PromptSplitter.from_tokenizer(tokenizer)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                           add_generation_prompt=True)
    response = "He has 3 + 4 = 7 apples. The answer is 7."
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] + tokenizer(response, add_special_tokens=False)[
        "input_ids"] + [tokenizer.eos_token_id]
    query = tokenizer.decode(ids, skip_special_tokens=False)
    sample = splitter.split(query, prompt, "7")
    assert sample.question == QUESTION
    assert sample.completion.strip() == response
    assert sample.completion == tokenizer.decode(ids[len(tokenizer(prompt, add_special_tokens=False)["input_ids"]):],
                                                 skip_special_tokens=True)
    with pytest.raises(RequestError, match="prompt template"):
        splitter.question_of("Question: " + QUESTION)
    with pytest.raises(RequestError, match="does not start with its prompt"):
        splitter.split("something else", prompt, "7")


def test_splitter_without_chat_template_and_with_an_input_template():
    plain = PromptSplitter()
    assert plain.split("What is 1+1? 2", "What is 1+1?", "2") == Sample("What is 1+1?", "What is 1+1?", "2", " 2")
    templated = PromptSplitter(input_template="Q: {}\nA:", special_tokens=["</s>"])
    sample = templated.split("Q: What is 1+1?\nA: 2</s>", "Q: What is 1+1?\nA:", "2")
    assert (sample.question, sample.completion) == ("What is 1+1?", " 2")
    with pytest.raises(RequestError, match="prompt template"):
        templated.question_of("What is 1+1?")


# ------------------------------------------------------------------------------------------------ groups
def _scored(prompt: str, k: int) -> ScoredSample:
    return ScoredSample(Sample(prompt, "q", "1", f"c{k}"), 0.1 * k, VerifyOutcome(Verdict.CORRECT, "1", 0.0), 0.5)


def test_a_group_keeps_the_version_of_its_first_sample():
    groups = GroupTracker(group_size=3)
    first = groups.reserve("p", latest_version=0)
    assert groups.reserve("p", latest_version=1).version == 0  # an update landed: the group keeps version 0
    other = groups.reserve("q", latest_version=1)
    assert other.version == 1 and groups.versions_in_use() == {0, 1}
    third = groups.reserve("p", latest_version=2)
    assert third is first and groups.reserve("p", latest_version=2).version == 2  # full: a new group opens
    assert [groups.record(first, _scored("p", k)) for k in range(3)][-1] is first
    assert groups.completed == 1 and 0 not in groups.versions_in_use()


def test_a_failed_sample_gives_its_place_back():
    groups = GroupTracker(group_size=2)
    a = groups.reserve("p", 0)
    b = groups.reserve("p", 0)
    groups.release(b)  # scoring failed: the client's retry must land in the same group
    assert groups.reserve("p", 5) is a
    groups.release(a)


def test_stale_groups_expire_and_state_round_trips():
    now = [0.0]
    groups = GroupTracker(group_size=2, timeout_s=10, clock=lambda: now[0])
    g = groups.reserve("p", 3)
    groups.record(g, _scored("p", 0))
    restored = GroupTracker(group_size=2)
    restored.load_state(groups.state())
    g2 = restored.reserve("p", 9)
    assert g2.version == 3 and restored.record(g2, _scored("p", 1)) is g2  # completes the saved group
    now[0] = 11.0
    assert groups.expire() == [g] and groups.expired == 1 and not groups.open
    again = groups_from_dicts(groups_to_dicts([g2]))
    assert [s.sample.completion for s in again[0].scored] == ["c0", "c1"] and again[0].version == 3


def test_the_record_of_answers_keeps_no_text_once_a_group_closes_and_stays_within_its_bound():
    now = [0.0]
    groups = GroupTracker(group_size=2, clock=lambda: now[0], remembered=4)
    first, second = _scored("p", 0), _scored("p", 1)
    g = groups.reserve("p", 0)
    groups.record(g, first)
    assert groups.answered(fingerprint(first.sample)).scored is first  # open: a repeat counts in the group
    groups.record(groups.reserve("p", 0), second)
    retry = groups.answered(fingerprint(second.sample))  # closed: a retry is answered, from no text
    assert retry.scored is None and retry.answer == Scored(0.5, 0.1, Verdict.CORRECT, 0)
    for prompt in ("q", "r"):  # 4 answers more: the bound keeps the newest 4
        for k in range(2):
            groups.record(groups.reserve(prompt, 0), _scored(prompt, k))
    assert groups.answers_kept == 4 and groups.answered(fingerprint(first.sample)) is None
    now[0] = RETRY_WINDOW_S + 1  # no longer retries: forgotten as the next answer is recorded
    groups.record(groups.reserve("s", 0), _scored("s", 0))
    assert groups.answers_kept == 1


# ------------------------------------------------------------------------------------------------ batcher
def test_concurrent_submits_are_batched_and_answered_in_order():
    sizes = []

    def double(items):
        sizes.append(len(items))
        time.sleep(0.05)
        return [2 * x for x in items]

    async def run():
        batcher = MicroBatcher(double, max_batch=16, max_wait_s=0.02)
        batcher.start()
        results = await asyncio.gather(*(batcher.submit(i) for i in range(40)))
        await batcher.stop()
        return results

    assert asyncio.run(run()) == [2 * i for i in range(40)]
    assert max(sizes) == 16 and len(sizes) < 10


def test_a_lone_item_on_an_idle_lane_runs_at_once_whatever_the_window():
    """A lone request is not held for company that is not coming: with a window of an hour, it is still run (the
    60 s bound only keeps a failing run from hanging)."""
    batches = []

    def record(items):
        batches.append(list(items))
        return items

    async def run():
        batcher = MicroBatcher(record, max_batch=64, max_wait_s=3600.0)
        batcher.start()
        first = await asyncio.wait_for(batcher.submit("a"), 60)
        second = await asyncio.wait_for(batcher.submit("b"), 60)
        await batcher.stop()
        return first, second

    assert asyncio.run(run()) == ("a", "b")
    assert batches == [["a"], ["b"]]


def test_a_quick_lone_item_runs_in_the_event_loop_after_the_first_and_anything_else_in_a_thread():
    """The RM's lane (`inline_lone`): the first lone item runs in a thread and is timed; lone items quicker than the
    window then run in the loop's own thread, saving two thread wake-ups; a batch of two, a lone item on a lane
    without the option, and a lone item after one that took longer than the window run in threads."""
    where = []

    def record(items):
        where.append((len(items), threading.current_thread() is threading.main_thread()))
        if "slow" in items:
            time.sleep(0.05)
        return items

    async def run():
        rm = MicroBatcher(record, max_batch=64, max_wait_s=0.02, inline_lone=True)
        verifier = MicroBatcher(record, max_batch=64, max_wait_s=0.02)
        rm.start(), verifier.start()
        for item in ("a", "b", "c"):
            await rm.submit(item)
        await asyncio.gather(rm.submit("d"), rm.submit("e"))  # two at once: one batch
        await verifier.submit("f"), await verifier.submit("g")
        await rm.submit("slow"), await rm.submit("after slow")
        await rm.stop(), await verifier.stop()

    asyncio.run(run())
    in_loop = [inline for _, inline in where]
    assert in_loop[:3] == [False, True, True]  # the first lone item timed in a thread, the next two in the loop
    assert where[3] == (2, False)  # "d" and "e" together
    assert in_loop[4:] == [False, False, True, False]  # the verifier's lane never; after "slow", a thread again


def test_a_busy_lane_batches_what_arrived_while_it_ran():
    """The requests that arrive while a batch runs are the next batch, together (none of them runs alone)."""
    entered, release = threading.Event(), threading.Event()
    batches = []

    def held(items):
        batches.append(list(items))
        entered.set()
        release.wait(60)
        return items

    async def run():
        batcher = MicroBatcher(held, max_batch=64, max_wait_s=0.0)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.to_thread(entered.wait, 60)
        rest = asyncio.ensure_future(asyncio.gather(*(batcher.submit(i) for i in range(1, 6))))
        await asyncio.sleep(0)  # the five are queued behind the running batch
        release.set()
        results = [await first, *await rest]
        await batcher.stop()
        return results

    assert asyncio.run(run()) == [0, 1, 2, 3, 4, 5]
    assert batches == [[0], [1, 2, 3, 4, 5]]


def test_a_busy_batcher_queues_every_item_and_a_failed_batch_fails_only_its_culprit():
    """Far more items than batches can hold at once all wait their turn (no refusal); a batch holding an item its
    function cannot take answers every other item with its result."""
    def slow_double(items):
        time.sleep(0.01)
        if any(x < 0 for x in items):
            raise ValueError(f"cannot take {[x for x in items if x < 0]}")
        return [2 * x for x in items]

    async def run():
        batcher = MicroBatcher(slow_double, max_batch=8, max_wait_s=0.0)
        batcher.start()
        items = list(range(1000)) + [-1] + list(range(1000, 1063))
        results = await asyncio.gather(*(batcher.submit(i) for i in items), return_exceptions=True)
        await batcher.stop()
        return items, results

    items, results = asyncio.run(run())
    failed = [i for i, r in zip(items, results) if isinstance(r, Exception)]
    assert failed == [-1] and "cannot take [-1]" in str(results[1000])
    assert [r for i, r in zip(items, results) if i >= 0] == [2 * i for i in items if i >= 0]


def test_a_stuck_lane_does_not_hold_up_the_others():
    release = threading.Event()

    def lane(items):
        if "hang" in items:
            release.wait(5)
        return list(items)

    async def run():
        batcher = MicroBatcher([lane, lane], max_batch=1, max_wait_s=0.0)
        batcher.start()
        stuck = asyncio.ensure_future(batcher.submit("hang"))
        await asyncio.sleep(0.05)
        start = time.monotonic()
        quick = await asyncio.gather(*(batcher.submit(f"x{i}") for i in range(5)))
        took = time.monotonic() - start
        release.set()
        assert await stuck == "hang"
        await batcher.stop()
        return quick, took

    quick, took = asyncio.run(run())
    assert quick == [f"x{i}" for i in range(5)] and took < 1.0


# ------------------------------------------------------------------------------------------------ scorer
def test_scoring_and_the_learners_encoding_at_once_never_share_a_tokenizer(model_dir):
    """The learner encodes its pairs with the tokenizer the scorer was built from, in its own thread, while the
    scoring thread scores. A fast tokenizer shared by both fails with "Already borrowed" (shown first, so the test
    can tell); the scorer keeps its own copy."""
    import threading

    from cooper_openrlhf.rm.model import encode_rm_texts, load_rm
    from cooper_openrlhf.rm.scorer import RMScorer

    model, tokenizer, version = load_rm(model_dir("tiny-qwen2-rm"))
    texts = ["What is 12 + 7? The answer is 19. " * 8] * 64
    items = [(0, "What is 12 + 7?", "19", "The answer is 19. " * 8)] * 64

    def at_once(first, second, rounds: int = 200) -> list[str]:
        errors, stop = [], threading.Event()

        def loop(work):
            try:
                for _ in range(rounds):
                    if stop.is_set():
                        return
                    work()
            except RuntimeError as exc:
                errors.append(str(exc))
                stop.set()

        threads = [threading.Thread(target=loop, args=(work,)) for work in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return errors

    def learner():
        encode_rm_texts(tokenizer, texts, 32)

    shared = at_once(learner, lambda: encode_rm_texts(tokenizer, texts, 48))  # the race, with one tokenizer
    assert shared and "Already borrowed" in shared[0]
    scorer = RMScorer(model, tokenizer, max_length=48, template_version=version, batch_size=64)
    assert scorer.tokenizer is not tokenizer
    with torch.no_grad():
        assert at_once(learner, lambda: scorer.logits_of(items), rounds=15) == []


def test_scorer_keeps_old_versions_while_pinned_and_publishes_copies(model_dir):
    from cooper_openrlhf.rm.model import load_rm
    from cooper_openrlhf.rm.scorer import RMScorer

    model, tokenizer, version = load_rm(model_dir("tiny-qwen2-rm"))
    trained, _, _ = load_rm(model_dir("tiny-qwen2-rm"))
    scorer = RMScorer(model, tokenizer, max_length=128, template_version=version, batch_size=4)
    item = ("What is 1 + 1?", "2", "The answer is 2.")
    before = scorer.logits_of([(0, *item)])[0]
    with torch.no_grad():
        trained.score.weight.mul_(-1.0)  # "training" moved the head
    assert scorer.publish(trained) == 1
    with torch.no_grad():
        trained.score.weight.mul_(0.0)  # training goes on in place: version 1 must not move with it
    old, new = scorer.logits_of([(0, *item), (1, *item)])
    assert old == pytest.approx(before, abs=1e-6) and new == pytest.approx(-before, abs=1e-4)
    assert scorer.retire(in_use={0}) == [] and sorted(scorer.models) == [0, 1]
    assert scorer.retire(in_use=set()) == [0] and sorted(scorer.models) == [1]
    with pytest.raises(KeyError, match="no longer kept"):
        scorer.logits_of([(0, *item)])
    assert scorer.publish(trained) == 2 and scorer.logits_of([(2, *item)])[0] == pytest.approx(0.0, abs=1e-6)
