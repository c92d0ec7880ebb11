"""The middle layer: `CooperPPOTrainer.train_step`'s control flow, with fake actor handles and engines
(tests/cooper_trainer_fakes.py). Every flag combination that the validation accepts for the step's control flow is
run; each fake records when its calls ran, so the tests can check what overlaps what. The checkpoints and the stop
on a hacking alarm: test_cooper_trainer_checkpoints.py.
"""

import pytest
import torch

import cooper_trainer_fakes as fakes
from cooper_trainer_fakes import (ALARM_AT_STEP_3, ARMS, COMPLETIONS, COOPER, N, PLACEMENTS, REFERENCES, RM, VERIFIED,
                                  FakeActor, FakeGroup, FakeRM, make_trainer, pool, samples)

__all__ = ["make_trainer", "pool"]  # the fixtures, used by name


@pytest.mark.parametrize("placement", PLACEMENTS, ids=lambda f: "+".join(x.split(".")[-1] for x in f) or "separate")
@pytest.mark.parametrize("arm", ARMS, ids=["cooper", "rollout", "mixed", "minibatch", "cooper-rule", "static", "rule"])
def test_a_step_completes_with_rewards_pairs_and_rm_update_as_configured(make_trainer, placement, arm):
    trainer, events, rm = make_trainer(arm + placement)
    batch = samples()
    status, next_step = trainer.train_step(batch, 4)
    assert next_step == 5
    rewards = [float(s.rewards[0]) for s in batch]
    if trainer.cooper.reward_source == "rule":
        assert rewards == [float(v) for v in VERIFIED]
    else:  # sigmoid of the logit of the RM before this step's update (a fresh FakeRM)
        logits = FakeRM().score([""] * 6, [r for r in REFERENCES for _ in range(N)], COMPLETIONS)
        assert rewards == pytest.approx(torch.sigmoid(torch.tensor(logits)).tolist())
    assert status["cooper/verified_accuracy"] == pytest.approx(3 / 6)
    assert status["policy_loss"] == pytest.approx(0.1)  # OpenRLHF's ppo_train ran and its status came back
    if not trainer.rm_trainable:
        assert events.count("rm.fit") == 0 and "cooper/valid_pair_rate" not in status
        return
    source = trainer.cooper.negative_source
    # Prompt 0 (right + wrong) always has a pair; prompt 1 (two right) only from the assistant; prompt 2 none.
    expected_valid = {"assistant": 2, "rollout": 1, "mixed": 2}[source]
    fitted = [pairs for pairs, _ in rm.fits]
    assert sum(p.num_valid for p in fitted) == expected_valid
    assert status["cooper/valid_pair_rate"] == pytest.approx(expected_valid / 3)
    minibatch = trainer.cooper.rm_update_granularity == "minibatch"
    assert events.count("rm.fit") == (expected_valid if minibatch else 1)
    assert events.names().index("rm.score") < events.names().index("rm.fit")  # rewards of step t: the RM before its update
    if trainer.args.ds.enable_sleep:
        order = [n for n in events.names() if n in ("rm.reload_states", "rm.fit", "rm.offload_states")]
        assert order[0] == "rm.reload_states" and order[-1] == "rm.offload_states"
    assert events.count("assistant.generate") == (0 if source == "rollout" else 1)


def test_answerless_rollouts_become_negatives_only_with_the_flag(make_trainer, monkeypatch):
    # Prompt 0: right, then no answer at all; prompts 1 and 2 as before (no wrong rollout beside a positive).
    monkeypatch.setattr(fakes, "COMPLETIONS", [COMPLETIONS[0], "I am not sure", *COMPLETIONS[2:]])
    rollout = (*COOPER, "--cooper.negative_source", "rollout")
    for flags, expected_valid in ((rollout, 0), ((*rollout, "--cooper.answerless_negatives"), 1)):
        trainer, _, rm = make_trainer(flags)
        status, _ = trainer.train_step(samples(), 1)
        assert sum(pairs.num_valid for pairs, _ in rm.fits) == expected_valid
        assert status["cooper/pairs_answerless_negative"] == pytest.approx(float(expected_valid))
    (pairs, _), = rm.fits
    assert pairs.valid[0] and pairs.negatives[0] == "I am not sure" and pairs.negative_source[0] == "rollout"


@pytest.mark.parametrize("arm", [RM, COOPER], ids=["static", "cooper"])
def test_require_answer_pays_answerless_rollouts_nothing_and_logs_the_gated_reward(make_trainer, arm):
    # COMPLETIONS[4] ("I am not sure") has no final answer; every other rollout keeps the RM's reward.
    logits = FakeRM().score([""] * 6, [r for r in REFERENCES for _ in range(N)], COMPLETIONS)
    paid = torch.sigmoid(torch.tensor(logits)).tolist()
    paid[4] = 0.0
    trainer, _, _ = make_trainer((*arm, "--cooper.require_answer"))
    batch = samples()
    status, _ = trainer.train_step(batch, 1)
    assert [float(s.rewards[0]) for s in batch] == pytest.approx(paid)
    assert status["cooper/rm_reward_mean"] == pytest.approx(sum(paid) / 6)
    ungated, _, _ = make_trainer(arm)
    batch = samples()
    ungated.train_step(batch, 1)
    assert float(batch[4].rewards[0]) > 0.0  # without the flag the RM's own reward


def test_rewrites_run_while_the_rm_scores_and_the_rm_trains_beside_the_policy(make_trainer):
    trainer, events, _ = make_trainer(COOPER, assistant_seconds=0.4, policy_seconds=1.0)
    status, _ = trainer.train_step(samples(), 1)
    rewrite_start, rewrite_end = events.span("assistant.generate")
    score_start, _ = events.span("rm.score")
    assert score_start < rewrite_end  # scoring did not wait for the slowed assistant
    fit_start, _ = events.span("rm.fit")
    policy_start, policy_end = events.span("policy.fit")
    assert fit_start < policy_end  # the RM update ran beside the policy update
    assert events.span("policy.broadcast_to_vllm")[0] >= rewrite_end  # no weight sync under the assistant's feet
    assert status["timeline/rewrites_end"] > status["timeline/score_start"]
    assert "timing/cooper_negatives" not in status  # it overlapped: not summed into OpenRLHF's step total


def test_the_rms_read_at_an_evaluation_step_is_timed_as_a_stage_of_that_step(make_trainer):
    """At every --eval.steps step the RM is read after its update (probe suite, verifier accuracy): on an RM arm that
    read can take longer than the rest of the step, so it is a stage of its own in the step's timing."""
    trainer, _, _ = make_trainer((*COOPER, "--eval.steps", "2"))
    at_eval, next_step = trainer.train_step(samples(), 1)
    assert next_step == 2 and at_eval["timing/cooper_rm_read"] >= 0
    assert at_eval["timeline/rm_read_start"] >= at_eval["timeline/rm_update_end"]  # the RM after this step's update
    between, _ = trainer.train_step(samples(), 2)
    assert "timing/cooper_rm_read" not in between


@pytest.mark.parametrize("colocated", [False, True])
def test_colocated_rm_hands_its_cached_memory_back_after_scoring_and_after_its_update(make_trainer, colocated):
    """As stock OpenRLHF does after its reward forwards: on shared GPUs the RM's cache is emptied before the
    policy's turn, and after the RM's own update, before the engines wake for the next rollouts; on
    GPUs of its own it is left alone."""
    trainer, events, _ = make_trainer((*COOPER, "--train.colocate_all") if colocated else COOPER)
    trainer.train_step(samples(), 1)
    assert events.count("rm.empty_cache") == (2 if colocated else 0)
    if colocated:
        assert events.span("rm.score")[1] <= events.span("rm.empty_cache", 0)[0] <= events.span("policy.fit")[0]
        assert events.span("rm.fit")[1] <= events.span("rm.empty_cache", 1)[0]


def test_colocated_steps_stay_serial(make_trainer):
    trainer, events, _ = make_trainer((*COOPER, "--train.colocate_all"), assistant_seconds=0.3)
    trainer.train_step(samples(), 1)
    assert events.span("rm.score")[0] >= events.span("assistant.generate")[1]
    assert events.span("rm.fit")[0] >= events.span("policy.fit")[1]


def test_sleeping_engines_are_woken_once_for_the_rewrites_and_put_back(make_trainer):
    flags = (*COOPER, "--train.colocate_all", "--vllm.enable_sleep")
    trainer, events, _ = make_trainer(flags)
    status, _ = trainer.train_step(samples(), 1)
    # One wake/sleep pair for the rewrites, plus the weights-only wake of OpenRLHF's own weight sync.
    assert (events.count("engine.wake_up"), events.count("engine.sleep")) == (2, 1)
    assert status["cooper/vllm_wake_sleep_pairs"] == 1.0
    rollout_only, events, _ = make_trainer((*flags, "--cooper.negative_source", "rollout"))
    rollout_only.train_step(samples(), 1)
    assert (events.count("engine.wake_up"), events.count("engine.sleep")) == (1, 0)  # nothing to generate


def test_the_next_step_is_scored_by_the_updated_rm(make_trainer):
    trainer, _, rm = make_trainer(COOPER)
    first = samples()
    trainer.train_step(first, 1)
    second = samples()
    trainer.train_step(second, 2)
    assert rm.bias == 1.0
    shift = [torch.logit(s2.rewards) - torch.logit(s1.rewards) for s1, s2 in zip(first, second)]
    assert all(float(d) == pytest.approx(0.5, abs=1e-4) for d in shift)


def test_each_distinct_rollout_is_scored_once_over_the_rm_ranks_and_every_copy_gets_its_logit(make_trainer):
    from cooper_openrlhf.core import RolloutTexts

    trainer, events, _ = make_trainer(COOPER)
    ranks = [FakeRM(), FakeRM()]
    trainer.rm_group = FakeGroup([FakeActor(rm, f"rm{i}", events) for i, rm in enumerate(ranks)])
    scored = []
    for rm in ranks:
        score = rm.score
        rm.score = lambda q, r, c, score=score: scored.append(list(zip(q, r, c))) or score(q, r, c)
    # Prompt 0's group writes the same right answer three times; prompt 1's two wrong answers twice each.
    texts = RolloutTexts(["a"] * 3 + ["b"] * 4, ["2"] * 3 + ["4"] * 4,
                         ["\\boxed{2}"] * 3 + ["\\boxed{5}", "\\boxed{6}", "\\boxed{5}", "\\boxed{6}"])
    logits = trainer.rm_logits(texts)
    assert logits.tolist() == [2.0, 2.0, 2.0, -1.0, -1.0, -1.0, -1.0]
    assert [len(part) for part in scored] == [2, 1]  # three distinct triples, split over the two ranks
    assert sorted(t for part in scored for t in part) == sorted(set(zip(texts.questions, texts.references,
                                                                        texts.completions)))
    assert trainer.rm_logits(RolloutTexts(["a"], ["2"], ["\\boxed{2}"])).tolist() == [2.0]  # one rank idle


def test_a_failing_stage_fails_the_step(make_trainer):
    trainer, _, rm = make_trainer(COOPER)

    def broken(*args):
        raise RuntimeError("RM rank died")

    rm.score = broken
    with pytest.raises(RuntimeError, match="RM rank died"):
        trainer.train_step(samples(), 1)




def test_the_hacking_alarm_switches_the_reward_to_the_rule_verifier_with_rule_reward(make_trainer):
    trainer, _, _ = make_trainer((*RM, *ALARM_AT_STEP_3, "--cooper.on_hacking", "rule_reward"))
    statuses, rewards = [], []
    for step in range(4):
        batch = samples()
        status, _ = trainer.train_step(batch, step)
        statuses.append(status)
        rewards.append([float(s.rewards[0]) for s in batch])
    assert [s["cooper/hacking_alarm"] for s in statuses] == [0.0, 0.0, 1.0, 1.0]
    assert [s["cooper/reward_from_rule"] for s in statuses] == [0.0, 0.0, 1.0, 1.0]
    assert rewards[2] != [float(v) for v in VERIFIED]  # the alarm's step was still paid by the RM
    assert rewards[3] == [float(v) for v in VERIFIED]
    assert statuses[3]["cooper/rm_reward_mean"] == pytest.approx(statuses[0]["cooper/rm_reward_mean"])  # still logged


def test_a_healthy_run_never_alarms(make_trainer):
    trainer, _, _ = make_trainer((*RM, "--cooper.hacking_window", "3", "--cooper.on_hacking", "stop"))
    for step in range(5):
        status, _ = trainer.train_step(samples(), step)
        assert status["cooper/hacking_alarm"] == 0.0  # a steady gap of 0.075 is far below the default ceiling


def test_a_window_of_steps_without_a_correct_rollout_warns_once_naming_the_likely_causes(make_trainer, caplog):
    from cooper_openrlhf.ray.trainer import NO_CORRECT_ROLLOUT_WINDOW

    trainer, _, _ = make_trainer(("--cooper.reward_source", "rule"))

    def nothing_verifies():  # the same rollouts against references no rollout states (raw labels, say)
        batch = samples()
        for sample in batch:
            sample.labels = ["12345"]
        return batch

    def warnings():
        return [r.getMessage() for r in caplog.records if "no rollout was verified correct" in r.getMessage()]

    trainer.train_step(nothing_verifies(), 0)
    trainer.train_step(samples(), 1)  # a correct rollout resets the window
    warned_at = []
    for step in range(2, 2 + 2 * NO_CORRECT_ROLLOUT_WINDOW):
        status, _ = trainer.train_step(nothing_verifies(), step)
        assert status["cooper/verified_accuracy"] == 0.0
        warned_at += [step] * (len(warnings()) - len(warned_at))
    assert warned_at == [1 + NO_CORRECT_ROLLOUT_WINDOW]  # the window'th empty step after the reset, and only then
    assert "--data.label_key holds whole solutions" in warnings()[0] and "--rollout.max_new_tokens" in warnings()[0]


def test_offline_pairs_replace_only_where_the_rm_updates_pairs_come_from(make_trainer, tmp_path):
    """--cooper.offline_pairs (the lab's offline_pairs control): no rewrite is requested, and each step's RM update
    trains on that step's group of the file; rollouts, scoring and the policy update are Cooper's."""
    import json

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"step": s, "question": f"Q{s}?", "reference": str(s), "positive": f"is {s}",
                                        "negative": f"is {s + 1}"}) + "\n" for s in range(3) for _ in range(2)))
    trainer, events, rm = make_trainer((*COOPER, "--cooper.offline_pairs", str(path)))
    status, _ = trainer.train_step(samples(), 1)
    assert "assistant.generate" not in events.names()
    (pairs, global_valid), = rm.fits
    assert pairs.questions == ["Q1?", "Q1?"] and pairs.negatives == ["is 2", "is 2"] and global_valid == 2
    assert status["cooper/offline_pairs"] == 2.0 and status["cooper/rm_updated"] == 1.0
    assert "cooper/rm_reward_mean" in status  # the policy is still paid by the RM
