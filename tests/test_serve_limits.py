"""The reward service's answers to faults, one sample at a time: a text no tokenizer takes is its own request's 400
(naming the sample and field), a batch that fails is scored apart so that only its culprit fails, a NaN score is
its request's error and never recorded for learning, and the memory bound refuses with Retry-After only past its
limit. The same over HTTP with OpenRLHF's own client: tests/test_serve_load.py."""

import asyncio
import math

import pytest

from cooper_openrlhf.serve.admission import Admission, Overloaded
from cooper_openrlhf.serve.app import route_label
from cooper_openrlhf.serve.batcher import results_or_errors
from cooper_openrlhf.serve.protocol import RequestError, Sample
from cooper_openrlhf.serve.validation import check_sample_texts
from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome


@pytest.mark.parametrize("field, bad, words", [
    ("query", "The answer is \ud800 2.", "sample 1: field 'query' is not valid Unicode text"),
    ("prompts", "\udfff", "sample 1: field 'prompts' is not valid Unicode text"),
    ("labels", "x" * 101, "sample 1: field 'labels' has 101 characters; at most 100"),
])
def test_a_text_no_tokenizer_takes_is_refused_naming_sample_and_field(field, bad, words):
    columns = {"query": ["q ok", "q ok: π ≈ 3.14, 数学"], "prompts": ["p", "Ünïcode p"], "labels": ["1", "½"]}
    check_sample_texts(columns["query"], columns["prompts"], columns["labels"], max_chars=100)  # good ones pass
    columns[field][1] = bad
    with pytest.raises(RequestError) as refused:
        check_sample_texts(columns["query"], columns["prompts"], columns["labels"], max_chars=100)
    assert refused.value.status == 400 and words in str(refused.value)


def test_a_failing_batch_is_bisected_so_only_its_culprits_fail():
    calls = []

    def score(items):
        calls.append(len(items))
        if "poison" in items:
            raise UnicodeEncodeError("utf-8", "poison", 0, 1, "surrogates not allowed")
        return [len(x) for x in items]

    items = [f"good{i}" for i in range(31)] + ["poison"] + [f"fine{i}" for i in range(32)]
    outcomes = results_or_errors(score, items)
    assert isinstance(outcomes[31], UnicodeEncodeError)
    assert outcomes[:31] + outcomes[32:] == [len(x) for x in items if x != "poison"]
    assert len(calls) <= 1 + 2 * math.ceil(math.log2(len(items)))  # bisection, not one call per item
    assert results_or_errors(score, ["a", "bb"]) == [1, 2] and calls[-1] == 2  # a good batch: one call


class _FakeScorer:
    """The RM whose logit is NaN for one completion; version 0 forever."""

    latest = 0

    def logits_of(self, items):
        return [math.nan if "nan" in completion else 0.5 for _, _, _, completion in items]

    def retire(self, in_use):
        return []


def test_a_nan_score_is_its_requests_error_and_never_recorded_for_learning():
    from cooper_openrlhf.serve.metrics import ServiceLog
    from cooper_openrlhf.serve.service import NonFiniteScore, RewardService, ServiceConfig

    def verify(references, completions):
        return [VerifyOutcome(Verdict.CORRECT, "1", 0.0, None) for _ in completions]

    service = RewardService(ServiceConfig(group_size=2, groups_per_update=1), _FakeScorer(), [verify],
                            ServiceLog(None))

    async def run():
        await service.start()
        try:
            good = await service.score([Sample("p", "q", "1", "the answer is 1")])
            with pytest.raises(NonFiniteScore, match="sample 0: the RM's logit is nan"):
                await service.score([Sample("p", "q", "1", "nan here")])
            group = next(iter(service.groups.open.values()))
            recorded = [s.sample.completion for s in group.scored]
            return good, recorded, group.reserved
        finally:
            await service.stop(save=False)

    good, recorded, reserved = asyncio.run(run())
    assert good[0].logit == 0.5 and recorded == ["the answer is 1"] and reserved == 1  # its place was given back


def test_the_memory_bound_refuses_past_its_limit_with_retry_after_and_frees_on_answer():
    admission = Admission(max_samples=10, max_bytes=1000)
    with admission.admit(8, 100):
        with admission.admit(2, 100):
            assert (admission.samples, admission.bytes) == (10, 200)
            with pytest.raises(Overloaded, match="--max-queued-samples") as refused:
                with admission.admit(1, 1, samples_per_second=4.0):
                    pass
            assert refused.value.retry_after_s == 3  # 10 samples in flight at 4 a second
        with pytest.raises(Overloaded, match="--max-queued-bytes"):
            with admission.admit(1, 901):
                pass
    assert (admission.samples, admission.bytes, admission.refused) == (0, 0, 2)


def test_route_labels_are_the_known_routes_or_other():
    assert [route_label(p) for p in ("/get_reward", "/metrics", "/health", "/x/1", "/get_reward/")] == \
        ["/get_reward", "/metrics", "/health", "other", "other"]
