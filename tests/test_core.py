"""The Cooper core on plain data: the reward forms, the pairs, the metrics and the hacking response, hand-worked."""

from types import SimpleNamespace

import pytest
import torch

from cooper_openrlhf.algo.hacking import HackingMonitorConfig
from cooper_openrlhf.core import (REWARD_MODES, HackingResponse, PairConfig, PayConfig, RolloutTexts, RolloutVerdicts,
                                  build_pairs, finish_pairs, plan_pairs, rewards, rm_pay)
from cooper_openrlhf.core.pay import judged_correct, reward_metrics
from cooper_openrlhf.core.rollouts import verdict_metrics
from cooper_openrlhf.core.step_pairs import rewrite_request
from cooper_openrlhf.verify.rule import Verdict

LOGITS = [2.0, -1.0, 0.0, 3.0]
VERDICTS = [Verdict.CORRECT, Verdict.INCORRECT, Verdict.NO_ANSWER, Verdict.TIMEOUT]
SIG = torch.sigmoid(torch.tensor(LOGITS)).tolist()


def paid(mode: str, paying_rule: bool = False) -> list[float]:
    return rewards(REWARD_MODES[mode], RolloutVerdicts.of(VERDICTS), LOGITS, paying_rule).paid.tolist()


def test_the_services_reward_modes():
    assert paid("rm") == pytest.approx(SIG)
    assert paid("rm_binary") == [1.0, 0.0, 1.0, 1.0]
    assert paid("rule") == [1.0, 0.0, 0.0, 0.0]
    # no answer is gated to 0; a timeout is not the completion's fault and is not gated
    assert paid("rm_answer_gated") == pytest.approx([SIG[0], SIG[1], 0.0, SIG[3]])
    assert set(REWARD_MODES) == {"rm", "rm_binary", "rule", "rm_answer_gated"}
    with pytest.raises(ValueError, match="valid"):
        REWARD_MODES["paper"]


def test_the_trainers_flags_name_the_same_forms_and_a_threshold():
    flags = SimpleNamespace(reward_source="rm", reward_form="discrete", reward_threshold=0.8, require_answer=True)
    pay = PayConfig.from_flags(flags)
    assert rm_pay(pay, LOGITS, [False, False, True, False]).tolist() == [1.0, 0.0, 0.0, 1.0]  # sigmoid(2) < 0.9
    with pytest.raises(ValueError, match="valid"):
        PayConfig(source="judge")


def test_after_the_alarm_the_rule_pays_and_the_rm_still_pays_its_form():
    switched = rewards(REWARD_MODES["rm_binary"], RolloutVerdicts.of(VERDICTS), LOGITS, paying_rule=True)
    assert switched.paid.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert switched.rm.tolist() == [1.0, 0.0, 1.0, 1.0]
    no_rm = rewards(PayConfig(), RolloutVerdicts.of(VERDICTS))
    assert no_rm.rm is None and no_rm.paid.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_one_set_of_metric_keys_for_a_steps_rewards_and_verdicts():
    verdicts = RolloutVerdicts.of(VERDICTS)
    metrics = reward_metrics(verdicts, rm_pay(PayConfig(), LOGITS, verdicts.answerless))
    assert metrics["cooper/verified_accuracy"] == 0.25
    assert metrics["cooper/rm_reward_mean"] == pytest.approx(sum(SIG) / 4)
    assert metrics["cooper/reward_hacking_gap"] == pytest.approx(sum(SIG) / 4 - 0.25)
    assert metrics["cooper/rm_reward_correct_mean"] == pytest.approx(SIG[0])
    assert reward_metrics(verdicts, None) == {"cooper/verified_accuracy": 0.25}
    assert verdict_metrics(VERDICTS) == {"cooper/verified_accuracy": 0.25, "cooper/verify_timeouts": 1.0,
                                         "cooper/verify_no_answer": 1.0, "cooper/verify_errors": 0.0}
    assert judged_correct(LOGITS) == [True, False, True, True]


# Two prompts x 3 rollouts. A: right, wrong (RM 0.2), wrong (RM 0.9). B: right, answerless, right.
TEXTS = RolloutTexts(["A?"] * 3 + ["B?"] * 3, ["5"] * 3 + ["7"] * 3,
                     ["\\boxed{5}", "\\boxed{6}", "\\boxed{8}", "\\boxed{7}", "no idea", "\\boxed{7}"])
STEP_VERDICTS = RolloutVerdicts([True, False, False, True, False, True], [False, True, True, False, False, False],
                                [False, False, False, False, True, False])
SCORES = [0.0, 0.2, 0.9, 0.0, 0.5, 0.0]


@pytest.mark.parametrize("source", ["assistant", "rollout", "mixed"])
def test_the_pipeline_run_in_two_halves_and_serially_gives_the_same_pairs(source):
    """The trainer splits the pipeline around its RM scoring, the service runs it in a row: one pipeline."""
    config = PairConfig(3, source, answerless_negatives=True, seed=4)
    asked = []

    def rewrite(questions, positives, prompts, step):
        asked.append((list(prompts), step))
        return {p: positives[p].replace("\\boxed{", "\\boxed{1") for p in prompts}, {"cooper/negative_attempts": 1.0}

    plan = plan_pairs(config, STEP_VERDICTS)
    request = rewrite_request(config, plan, TEXTS)
    rewrites, _ = rewrite(request.questions, request.positives, request.prompts, 3)
    halves, half_metrics = finish_pairs(config, plan, TEXTS, rewrites, SCORES, 3)
    serial, serial_metrics = build_pairs(config, TEXTS, STEP_VERDICTS, SCORES, rewrite, 3)
    assert halves == serial and {**half_metrics, "cooper/negative_attempts": 1.0} == serial_metrics
    assert asked[0] == asked[1] == ({"assistant": [0, 1], "rollout": [], "mixed": []}[source], 3)
    expected = {"assistant": ["\\boxed{15}", "\\boxed{17}"], "rollout": ["\\boxed{8}", "no idea"],
                "mixed": ["\\boxed{8}", "no idea"]}[source]  # hardest: the wrong rollout the RM pays most
    assert serial.negatives == expected and serial.valid == [True, True]


def test_rollouts_that_are_not_prompt_grouped_are_refused():
    config = PairConfig(3, "rollout")
    mixed_up = RolloutTexts(["A?", "B?", "A?"] * 2, ["5"] * 6, TEXTS.completions)
    with pytest.raises(ValueError, match="prompt 0: its 3 rollouts carry different questions"):
        build_pairs(config, mixed_up, STEP_VERDICTS, SCORES, lambda *a, step: ({}, {}), 0)


@pytest.mark.parametrize("on_hacking, paying_rule, stop", [("warn", 0.0, False), ("rule_reward", 1.0, False),
                                                          ("stop", 0.0, True)])
def test_the_hacking_response_is_taken_once_when_the_alarm_turns_on(on_hacking, paying_rule, stop, caplog):
    response = HackingResponse(HackingMonitorConfig(window=3, gap_ceiling=0.3, rules="gap_high"), on_hacking)
    logged = [response.watch(step, {"cooper/reward_hacking_gap": 0.5}) for step in range(4)]
    assert [m["cooper/hacking_alarm"] for m in logged] == [0.0, 0.0, 1.0, 1.0]
    assert [m["cooper/reward_from_rule"] for m in logged] == [0.0, 0.0, paying_rule, paying_rule]
    assert response.stop == stop and response.paying_rule == bool(paying_rule)
    assert ("from step 3 on" in caplog.text) == (on_hacking == "rule_reward")
