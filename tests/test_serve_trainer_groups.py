"""The service's GRPO groups are the trainer's (serve/trainer_groups.py): a trainer whose n is not `--group-size`
is refused with a sentence naming both numbers, and held-out prompts are scored but never grouped or learned from.

Driven by OpenRLHF's own client (`SingleTurnAgentExecutor._fetch_rewards_via_http`: one sample per request, 5 tries
1 s apart) against the real service over HTTP (tests/test_serve_http.py's RunningService), a step's samples sent at
once as OpenRLHF's rollout workers send them."""

import asyncio
import json

import pytest
import requests
from test_serve_http import RunningService

from cooper_openrlhf.serve.trainer_groups import heldout_questions, last_user_message

REPLIES = ["The answer is {}.", "I think it is 100.", "So we get {}.", "Maybe 0."]


def _step(service: RunningService, questions: list[tuple[str, str]], n: int) -> list:
    """One trainer step: n samples of each question, all POSTed at once by OpenRLHF's client; per sample, its
    rewards dict or the exception the client raised after its tries."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(service.url + "/get_reward")

    async def send_all():
        calls = []
        for i in range(n):
            for question, answer in questions:
                body = service.body(question, answer, REPLIES[i % len(REPLIES)].format(answer))
                calls.append(executor._fetch_rewards_via_http(body["query"], body["prompts"], body["labels"]))
        return await asyncio.gather(*calls, return_exceptions=True)

    return asyncio.run(send_all())


def _health(service) -> dict:
    return requests.get(service.url + "/health", timeout=10).json()


QUESTIONS = [(f"What is {a} + {b}?", str(a + b)) for a, b in [(2, 3), (7, 4), (10, 5), (6, 6)]]


def test_a_trainer_with_fewer_samples_per_prompt_than_the_group_size_is_refused_naming_both(model_dir, tmp_path):
    """n = 4 against --group-size 8, two prompts a step: step 1's groups stay open, step 2 opens two more."""
    service = RunningService(model_dir, tmp_path, group_size=8, groups_per_update=2)
    try:
        first = _step(service, QUESTIONS[:2], n=4)
        assert all(isinstance(r, list) for r in first)  # step 1 cannot tell: every sample paid
        second = _step(service, QUESTIONS[2:], n=4)
        health = _health(service)
    finally:
        service.stop()
    assert all(isinstance(r, RuntimeError) for r in second)  # OpenRLHF's client gives up after its 5 tries
    assert health["groups"].startswith("mismatch:")
    assert "trainer sends 4 samples per prompt" in health["groups"] and "--group-size is 8" in health["groups"]
    assert health["rounds"] == 0  # nothing learned from groups that are not the trainer's


def test_a_trainer_with_more_samples_per_prompt_than_the_group_size_is_refused_naming_both(model_dir, tmp_path):
    """n = 16 against --group-size 8: each prompt fills a group and goes on into a second one in the same step."""
    service = RunningService(model_dir, tmp_path, group_size=8, groups_per_update=2)
    try:
        first = _step(service, QUESTIONS[:2], n=16)
        second = _step(service, QUESTIONS[2:], n=16)
        health = _health(service)
    finally:
        service.stop()
    assert all(isinstance(r, list) for r in first)  # the samples already in flight are scored and answered
    assert all(isinstance(r, RuntimeError) for r in second)
    assert "A prompt has 16 samples at this RM version, more than --group-size 8" in health["groups"]
    assert health["rounds"] == 0


def test_a_trainer_whose_groups_match_is_never_refused(model_dir, tmp_path):
    service = RunningService(model_dir, tmp_path, group_size=4, groups_per_update=2)
    try:
        steps = [_step(service, QUESTIONS[i:i + 2], n=4) for i in (0, 2, 0)]
        health = _health(service)
    finally:
        service.stop()
    assert all(isinstance(r, list) for step in steps for r in step)
    assert health["groups"] == "ok" and health["groups_completed"] == 6


def test_heldout_prompts_are_scored_and_never_grouped(model_dir, tmp_path):
    """OpenRLHF's eval rollouts (n = 4 by default, --eval.n_samples_per_prompt) reach the same URL; declared with
    --heldout-prompts they are paid the RM's score and take no place in any group, so nothing learns from them and
    they break no check."""
    heldout = tmp_path / "eval.jsonl"
    heldout.write_text("".join(json.dumps({"input": q, "label": a}) + "\n" for q, a in QUESTIONS[2:]))
    service = RunningService(model_dir, tmp_path, group_size=4, groups_per_update=2,
                             heldout=heldout_questions(str(heldout)))
    try:
        train = _step(service, QUESTIONS[:2], n=4)
        evaluation = _step(service, QUESTIONS[2:], n=4)
        again = _step(service, QUESTIONS[:2], n=4)
        health = _health(service)
        logits = service.direct_logits([(q, a, REPLIES[0].format(a)) for q, a in QUESTIONS[2:]])
    finally:
        service.stop()
    assert all(isinstance(r, list) for r in train + evaluation + again)
    assert health["groups"] == "ok" and health["heldout_samples"] == 8
    assert health["groups_completed"] == 4 and health["open_groups"] == 0
    paid = [r[0]["extra_logs"]["cooper/rm_logit"][0] for r in evaluation[:2]]  # the first reply of each question
    assert paid == pytest.approx(logits, abs=1e-4)


def test_a_heldout_file_names_its_bad_row(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps({"input": "What is 1 + 1?"}) + "\n" + json.dumps({"question": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"eval.jsonl:2: field 'input' is missing"):
        heldout_questions(str(path))
    assert last_user_message([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]) == "q"


def test_the_refusal_names_the_likely_cause_by_what_the_open_groups_hold():
    from cooper_openrlhf.serve.trainer_groups import open_when_a_round_completes

    assert open_when_a_round_completes([], {}, 8, 4) is None
    more = open_when_a_round_completes([("p", 4)], {"p": 12}, 8, 4)  # a prompt past the group size: n > group size
    assert "A prompt has 12 samples" in more and "more than --group-size 8" in more
    partial = open_when_a_round_completes([("q", 3)], {"q": 3}, 8, 4)  # a partial group of another prompt
    assert "Most likely --groups-per-update 4 is below the trainer's prompts per step" in partial
    assert "more than --group-size 8" not in partial.split(";")[0]
