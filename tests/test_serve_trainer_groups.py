"""The service's GRPO groups against the trainer's (serve/trainer_groups.py, serve/groups.py): whatever the trainer
does (an n that is not `--group-size`, a partial last step, a long step, a restart, a retry, a request by hand),
every well-formed sample is answered, and what the bookkeeping cannot place costs learning, counted and explained at
/health. Held-out prompts are scored but never grouped or learned from.

Driven by OpenRLHF's own client (`SingleTurnAgentExecutor._fetch_rewards_via_http`: one sample per request, 5 tries
1 s apart) against the real service over HTTP (tests/test_serve_http.py's RunningService), a step's samples sent at
once as OpenRLHF's rollout workers send them."""

import asyncio
import json
import time

import pytest
import requests
from test_serve_http import RunningService

from cooper_openrlhf.serve.trainer_groups import heldout_questions, last_user_message

REPLIES = ["The answer is {}.", "I think it is 100.", "So we get {}.", "Maybe 0."]


def _step(service: RunningService, questions: list[tuple[str, str]], n: int, take: int = 0) -> list:
    """One trainer step: n samples of each question, all POSTed at once by OpenRLHF's client; per sample, its
    rewards dict or the exception the client raised after its tries. Each sample's text is its own, as a sampling
    policy's are (`take` tells one step's from another's; identical texts would be retries: serve/groups.py)."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(service.url + "/get_reward")

    async def send_all():
        calls = []
        for i in range(n):
            for question, answer in questions:
                body = service.body(question, answer, f"{REPLIES[i % len(REPLIES)].format(answer)} (take {take}.{i})")
                calls.append(executor._fetch_rewards_via_http(body["query"], body["prompts"], body["labels"]))
        return await asyncio.gather(*calls, return_exceptions=True)

    return asyncio.run(send_all())


def _step_with(service: RunningService, questions: list[tuple[str, str]], replies: list[str]) -> list:
    """One step whose samples are `replies` (formatted with each question's answer), sent at once."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(service.url + "/get_reward")

    async def send_all():
        bodies = [service.body(q, a, reply.format(a)) for reply in replies for q, a in questions]
        return await asyncio.gather(*[executor._fetch_rewards_via_http(b["query"], b["prompts"], b["labels"])
                                      for b in bodies], return_exceptions=True)

    return asyncio.run(send_all())


def _step_one(service: RunningService, question: tuple[str, str], completion: str) -> list:
    """One sample through OpenRLHF's client: [its rewards dict], or [the exception it raised]."""
    return _step_with(service, [question], [completion.replace("{", "{{").replace("}", "}}")])


def _health(service) -> dict:
    return requests.get(service.url + "/health", timeout=10).json()


QUESTIONS = [(f"What is {a} + {b}?", str(a + b)) for a, b in [(2, 3), (7, 4), (10, 5), (6, 6)]]


QUESTIONS_8 = [(f"What is {a} times {b}?", str(a * b)) for a, b in [(2, 3), (7, 4), (10, 5), (6, 6), (3, 9), (8, 2),
                                                                         (5, 5), (4, 7)]]


def _answered(results) -> bool:
    """Every sample got its rewards (a list), none the RuntimeError OpenRLHF's client raises after its 5 tries."""
    return all(isinstance(r, list) for r in results)


def test_a_trainer_with_fewer_samples_per_prompt_than_the_group_size_is_scored_and_told(model_dir, tmp_path):
    """n = 4 against --group-size 8, two prompts a step: no group completes. Every sample is answered; /health warns
    with the cause and the fix, and once two steps' worth of samples completed no group, learning shows failing."""
    service = RunningService(model_dir, tmp_path, group_size=8, groups_per_update=2)
    try:
        steps = [_step(service, QUESTIONS_8[i:i + 2], n=4) for i in (0, 2)]
        time.sleep(1.5)  # the open groups are looked at once a second
        warned = _health(service)
        steps += [_step(service, QUESTIONS_8[i:i + 2], n=4) for i in (4, 6)]
        health = _health(service)
    finally:
        service.stop()
    assert all(_answered(step) for step in steps)
    assert warned["groups"].startswith("warning:") and warned["learning"] == "ok"
    assert "trainer sends 4 samples per prompt" in warned["groups"] and "--group-size is 8" in warned["groups"]
    assert health["learning"].startswith("failing: no GRPO group of --group-size 8 completed in the last 32 samples")
    assert health["rounds"] == 0 and health["group_warnings_too_many_open"] >= 1


def test_a_trainer_with_more_samples_per_prompt_than_the_group_size_is_scored_and_its_split_groups_not_learned(
        model_dir, tmp_path):
    """n = 16 against --group-size 8: each prompt fills a group and goes on into a second one in the same step.
    Every sample is answered; the groups that share a prompt at one RM version are left out of the steps."""
    service = RunningService(model_dir, tmp_path, group_size=8, groups_per_update=2)
    try:
        steps = [_step(service, QUESTIONS[:2], n=16), _step(service, QUESTIONS[2:], n=16)]
        health = _health(service)
    finally:
        service.stop()
    assert all(_answered(step) for step in steps)
    assert health["groups_dropped_split_trainer_group"] >= 4 and health["groups_completed"] == 8
    assert "more samples per prompt than --group-size 8" in health["groups"]


@pytest.mark.parametrize("partial_step_after_s, update_s", [(3.0, 5.0), (30.0, 4.0)], ids=["quiet", "next_step"])
def test_an_episodes_partial_last_step_forms_a_step_of_its_own(model_dir, tmp_path, partial_step_after_s, update_s):
    """Three prompts an episode at two a step: OpenRLHF trains the partial last step. Its lone group forms a step
    once the trainer is quiet for --partial-round-after-s, or, when the trainer's policy update is shorter than
    that, at the next step's first sample (every group complete, STEP_GAP_S of quiet). So every step is one of the
    trainer's steps, and nothing is warned."""
    service = RunningService(model_dir, tmp_path, group_size=4, groups_per_update=2,
                             partial_step_after_s=partial_step_after_s)
    try:
        results = []
        for take in range(2):  # two episodes, each with the trainer's policy update (quiet) after every step
            for questions in (QUESTIONS[:2], QUESTIONS[2:3]):
                results += _step(service, questions, n=4, take=take)
                time.sleep(update_s)
        results += _step(service, QUESTIONS[:2], n=4, take=2)  # the third episode's first step
        time.sleep(1)
        health = _health(service)
    finally:
        service.stop()
    steps = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert _answered(results)
    assert [r["cooper/samples"] for r in steps] == [8.0, 4.0, 8.0, 4.0, 8.0] and health["ready_groups"] == 0
    assert health["groups_dropped_split_trainer_group"] == 0
    assert health["groups"] == "ok" and health["group_warnings_open_at_a_rounds_end"] == 0


def test_a_long_step_keeps_its_groups_while_samples_keep_coming(model_dir, tmp_path):
    """A group whose samples trickle in over longer than --group-timeout-s, never further apart than it: complete."""
    service = RunningService(model_dir, tmp_path, group_size=4, groups_per_update=1, group_timeout_s=1.5)
    try:
        results = []
        for i in range(4):
            results += _step_one(service, QUESTIONS[0], REPLIES[i].format(QUESTIONS[0][1]))
            time.sleep(0.8)
        health = _health(service)
    finally:
        service.stop()
    assert _answered(results)
    assert health["groups_completed"] == 1 and health["groups_expired"] == 0 and health["rounds"] == 1


def test_a_trainer_restarted_mid_step_does_not_finish_the_old_groups(model_dir, tmp_path):
    """Half a step, then silence (the trainer restarting), then the restarted trainer's whole step: the old partial
    groups are dropped, the new policy's samples fill groups of their own, and every sample is answered."""
    service = RunningService(model_dir, tmp_path, group_size=4, groups_per_update=2, stale_after_s=1.0)
    try:
        results = _step(service, QUESTIONS[:2], n=2)
        time.sleep(1.5)
        results += _step_with(service, QUESTIONS[:2], ["Restarted: {}.", "Restarted, so 7.", "Restarted: {} it is.",
                                                       "Restarted: 0."])
        health = _health(service)
        learned = service.service.last_step
    finally:
        service.stop()
    assert _answered(results)
    assert health["groups_dropped_silence"] == 2 and health["groups_completed"] == 2 and health["rounds"] == 1
    assert learned["cooper/samples"] == 8 and health["open_groups"] == 0


def test_a_retried_sample_gets_its_answer_again_and_is_not_scored_twice(model_dir, tmp_path):
    """A 200 lost on the wire: the client sends the byte-identical sample again. Inside an open group it gets the
    recorded answer and counts toward the group (OpenRLHF cannot tell it from the policy sampling the same text
    twice); after its group completed, while the step's other group still takes samples, it gets the answer, counts
    nowhere and does not end the step (a synchronous trainer cannot send its next step before every answer of this
    one is in). The next step's policy writing the same text, after the step, is a new sample."""
    service = RunningService(model_dir, tmp_path, group_size=4, groups_per_update=2)
    question, answer = QUESTIONS[0]
    try:
        replies = [REPLIES[i].format(answer) for i in range(4)]
        first = _step_one(service, (question, answer), replies[0])
        again = _step_one(service, (question, answer), replies[0])  # inside the open group
        rest = [_step_one(service, (question, answer), reply)[0] for reply in replies[1:3]]
        other = _step_with(service, QUESTIONS[1:2], REPLIES[:2])  # the step's other group, half sent
        after = _step_one(service, (question, answer), replies[2])  # its group complete, the other still open
        retried = _health(service)
        other += _step_with(service, QUESTIONS[1:2], REPLIES[2:])  # the other group completes: the step forms
        deadline = time.monotonic() + 60
        while _health(service)["rounds"] < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        learned = _health(service)
        next_step = _step_one(service, (question, answer), replies[2])  # the next step's policy, the same text
        health = _health(service)
    finally:
        service.stop()
    assert _answered(first + again + rest + after + other + next_step)
    assert again[0] == first[0] and after[0] == rest[-1]
    assert retried["samples_retried"] == 1 and retried["open_groups"] == 1  # no group opened for the retry
    # one step of both groups: neither left waiting for a step of its own
    assert learned["rounds"] == 1 and learned["ready_groups"] == 0 and learned["groups_completed"] == 2
    assert health["samples_repeated"] == 2 and health["samples_retried"] == 1
    assert health["open_groups"] == 1 and health["samples"] == 10  # the next step's sample opened a group
    assert health["rm_batch_mean"] * health["rm_batches"] == 8  # the distinct samples of each step scored, once


def test_a_request_by_hand_during_a_step_is_answered_and_the_run_goes_on(model_dir, tmp_path):
    """One hand-made request (a prompt the trainer never sends, three samples of three prompts in one body, more
    prompts than --groups-per-update) in the middle of the trainer's steps."""
    service = RunningService(model_dir, tmp_path, group_size=4, groups_per_update=1)
    try:
        results = _step(service, QUESTIONS[:1], n=4)
        bodies = [service.body(q, a, f"The answer is {a}.") for q, a in QUESTIONS[1:]]
        by_hand = requests.post(service.url + "/get_reward", timeout=30, json={
            key: [value for body in bodies for value in body[key]] for key in ("query", "prompts", "labels")})
        results += _step(service, QUESTIONS[:1], n=4, take=1)
        health = _health(service)
    finally:
        service.stop()
    assert _answered(results) and by_hand.status_code == 200 and len(by_hand.json()["rewards"]) == 3
    assert health["rounds"] == 2


def test_an_identical_sample_is_a_repeat_in_an_open_group_a_retry_soon_after_and_a_new_sample_later():
    from cooper_openrlhf.serve.groups import RETRY_WINDOW_S, GroupTracker, ScoredSample, fingerprint
    from cooper_openrlhf.serve.protocol import Sample
    from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome

    now = [0.0]
    groups = GroupTracker(group_size=2, clock=lambda: now[0])
    sample = Sample("p", "q", "1", "The answer is 1.")
    scored = ScoredSample(sample, 0.3, VerifyOutcome(Verdict.CORRECT, "1", 0.0), 0.6)
    group = groups.reserve("p", 0, "1")
    assert groups.answered(fingerprint(sample)) is None
    groups.record(group, scored)
    assert groups.repeat(groups.answered(fingerprint(sample))) is group  # the policy's duplicate completes it
    assert [s.reward for s in group.scored] == [0.6, 0.6] and groups.completed == 1
    now[0] = RETRY_WINDOW_S - 1  # a retry of the answer lost on the wire, in its step: answered, counted nowhere
    assert groups.repeat(groups.answered(fingerprint(sample))) is None and not groups.open
    groups.step_formed()  # the step: the same text after it is the next step's policy's, a new sample
    assert groups.answered(fingerprint(sample)) is None
    alone = GroupTracker(group_size=1, clock=lambda: now[0])
    alone.record(alone.reserve("p", 0, "1"), scored)
    assert alone.answered(fingerprint(sample)) is not None
    now[0] += RETRY_WINDOW_S + 1  # no step formed, but too late for the client's retries: a new sample
    assert alone.answered(fingerprint(sample)) is None
    restarted = GroupTracker(group_size=2, clock=lambda: now[0], silence_s=60)
    restarted.record(restarted.reserve("p", 0, "1"), scored)
    restarted.arrived()
    now[0] += 61  # a trainer restarted with its seed: the same text again, after a silence, is a sample
    restarted.arrived()
    assert restarted.answered(fingerprint(sample)) is None


def test_one_prompt_with_two_labels_makes_two_groups():
    from cooper_openrlhf.serve.groups import GroupTracker

    groups = GroupTracker(group_size=2)
    half = groups.reserve("What is 1/2 as a decimal?", 0, label="1/2")
    decimal = groups.reserve("What is 1/2 as a decimal?", 0, label="0.5")
    assert half is not decimal and half.key != decimal.key


def test_a_trainer_whose_groups_match_is_never_warned(model_dir, tmp_path):
    service = RunningService(model_dir, tmp_path, group_size=4, groups_per_update=2)
    try:
        steps = [_step(service, QUESTIONS[i:i + 2], n=4, take=k) for k, i in enumerate((0, 2, 0))]
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
        again = _step(service, QUESTIONS[:2], n=4, take=1)
        health = _health(service)
        logits = service.direct_logits([(q, a, f"{REPLIES[0].format(a)} (take 0.0)") for q, a in QUESTIONS[2:]])
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


def test_the_warning_names_the_likely_cause_by_what_the_open_groups_hold():
    from cooper_openrlhf.serve.trainer_groups import open_when_a_step_completes

    assert open_when_a_step_completes([], {}, 8, 4) is None
    more = open_when_a_step_completes([("p", 4)], {"p": 12}, 8, 4)  # a prompt past the group size: n > group size
    assert "A prompt has 12 samples" in more and "more than --group-size 8" in more
    partial = open_when_a_step_completes([("q", 3)], {"q": 3}, 8, 4)  # a partial group of another prompt
    assert "If it lasts, --groups-per-update 4 is below the trainer's prompts per step" in partial
    assert "an episode's partial last step" in partial  # the harmless causes are named too
    assert partial.index("--groups-per-update 4 is below") < partial.index("more than --group-size 8")


class _Steps:
    """The least a `StepSupervisor` needs: its config, groups and ready groups (serve/step_supervisor.py)."""

    def __init__(self, per_step: int, clock):
        from cooper_openrlhf.serve.groups import GroupTracker
        from cooper_openrlhf.serve.step_supervisor import StepSupervisor
        from cooper_openrlhf.serve.service import ServiceConfig

        self.host = type("Host", (StepSupervisor,), {})()
        self.host.config = ServiceConfig(group_size=1, groups_per_update=per_step, partial_step_after_s=30.0)
        self.host.groups, self.host.ready = GroupTracker(1, clock=clock), []
        self.host._step_wakeup, self.host.version = asyncio.Event(), 0
        self.host._init_group_checks()

    def complete(self, prompt: str, version: int = 0, samples: int = 1):
        """One request of `samples` samples of `prompt` (each a group of one), placed, then scored."""
        from cooper_openrlhf.serve.groups import ScoredSample
        from cooper_openrlhf.serve.protocol import Sample
        from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome

        self.host._arrived([(prompt, "")] * samples)
        groups = [self.host.groups.reserve(prompt, version) for _ in range(samples)]
        scored = ScoredSample(Sample(prompt, prompt, "1", "x"), 0.0, VerifyOutcome(Verdict.INCORRECT, "2", 0.0), 0.1)
        for group in groups:
            self.host._recorded(self.host.groups.record(group, scored))


def test_steps_are_bounded_leave_out_split_groups_and_form_from_a_quiet_partial_step():
    now = [0.0]
    steps = _Steps(per_step=2, clock=lambda: now[0])
    for i in range(11):  # a learner that fell 5 steps behind: the oldest beyond 4 steps' worth are dropped
        steps.complete(f"p{i}")
    first = steps.host._next_step()
    assert [g.prompt for g in first] == ["p3", "p4"] and steps.host.groups.dropped["backlog"] == 3
    steps.host.ready = []
    steps.complete("q", samples=2)  # one prompt in two groups at one version: a trainer group split over two of ours
    assert steps.host._next_step() == [] and steps.host.groups.dropped["split trainer group"] == 2
    steps.complete("r")
    assert steps.host._next_step() is None  # one group, and the trainer not quiet yet
    now[0] += 31
    assert [g.prompt for g in steps.host._next_step()] == ["r"]  # the partial last step
    steps.complete("s")
    now[0] += 2  # quiet, but shorter than a trainer's policy update: the step goes on
    steps.complete("t")
    assert [g.prompt for g in steps.host._next_step()] == ["s", "t"]  # one step, in arrival order
    steps.complete("u")
    now[0] += 4  # the next step's first sample after the policy update: u's step is over, its step forms first
    steps.host._arrived([("u2", "")])
    assert [g.prompt for g in steps.host._next_step()] == ["u"] and steps.host._next_step() is None
    steps.host.groups.reserve("by hand", 0)  # one sample of a prompt the trainer never sends: its group stays open
    now[0] += 20
    steps.complete("v")
    now[0] += 4  # that group's sample came 24 s ago: it may be this step's group still waiting for samples
    steps.host._arrived([("v2", "")])
    assert steps.host._next_step() is None
    steps.complete("w")
    assert [g.prompt for g in steps.host._next_step()] == ["v", "w"]
    now[0] += 10
    steps.complete("x")
    now[0] += 4  # 38 s without a sample: a stray, which does not hold the step boundary back
    steps.host._arrived([("x2", "")])
    assert [g.prompt for g in steps.host._next_step()] == ["x"]
    steps.complete("y")
    # at once: the next episode's step re-sends the partial step's prompt, so y's step forms first (and the new
    # group, waiting for its update, is of the next version: not a split of y's)
    steps.complete("y", version=1)
    steps.host.version = 1
    # the prompt again while y's step still waits for the step loop: nothing is taken from it or added to it
    steps.complete("y", version=2)
    assert [g.prompt for g in steps.host._next_step()] == ["y"]
    assert [g.version for g in steps.host._next_step()] == [1, 2]  # the two later groups, one step, not split
    assert steps.host.groups.dropped["split trainer group"] == 2


def test_a_step_is_one_log_line_with_version_pairs_loss_health_and_seconds():
    from cooper_openrlhf.serve.step_supervisor import step_summary

    line = step_summary(3, {"cooper/rm_version_after": 4.0, "cooper/rm_valid_pairs": 6.0, "cooper/rm_loss": 0.5312,
                             "cooper/rm_health/auc": 0.91, "cooper/samples": 32.0}, 2.04)
    assert line == "step 3: RM version 4, 6 pairs, loss 0.5312, anchor AUC 0.910, samples 32, 2.0s"
    assert step_summary(0, {}, 0.0) == "step 0: RM version -, - pairs, loss -, anchor AUC -, samples -, 0.0s"
