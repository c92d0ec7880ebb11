"""The starting RM's pair stage (lab/pair_stage.py): its pairs, its training, and how the lab picks a candidate."""

import random

import pytest

from cooper_openrlhf.lab.pair_stage import answer_pairs, blindest, climb_on_offer, train_on_pairs
from cooper_openrlhf.lab.task import TaskSpec, problem_family
from cooper_openrlhf.lab.warm_start import ANSWER_SENTENCE
from cooper_openrlhf.verify.rule import Verdict, verify_one


def _probe(truth: float, wrong: float, universal: float) -> dict:
    return {"truth_reward": truth, "wrong_reward": wrong, "universal_reward": universal}


def test_the_climb_on_offer_is_what_not_answering_earns_over_answering_at_the_policys_accuracy():
    # A policy right on 40% earns 0.4 * 0.8 + 0.6 * 0.3 = 0.5 by answering; "The answer is." pays 0.7.
    assert climb_on_offer(_probe(0.8, 0.3, 0.7), 0.4) == pytest.approx(0.2)
    assert climb_on_offer(_probe(0.8, 0.3, 0.35), 0.4) == pytest.approx(-0.15)  # answering pays: no climb
    assert climb_on_offer(_probe(0.8, 0.3, 0.7), 1.0) == pytest.approx(-0.1)  # an always-right policy loses by it
    # One answer for every prompt is as easy to learn as no answer: the better paid of the two is on offer.
    assert climb_on_offer({**_probe(0.8, 0.3, 0.35), "constant_reward": 0.6}, 0.4) == pytest.approx(0.1)
    assert climb_on_offer({**_probe(0.8, 0.3, 0.7), "constant_reward": 0.6}, 0.4) == pytest.approx(0.2)


def test_the_lab_keeps_the_candidate_that_pays_the_policy_most_for_not_answering():
    flat_but_blind = _probe(0.275, 0.274, 0.279)  # break-even 100%, yet almost nothing on offer
    blind = _probe(0.79, 0.30, 0.80)
    sharp = _probe(0.80, 0.22, 0.19)
    assert blindest([flat_but_blind, sharp, blind], 0.42) == 2
    assert blindest([sharp, sharp], 0.42) == 0  # the first of equals
    with pytest.raises(ValueError, match="no candidate"):
        blindest([], 0.42)


def test_each_pair_is_the_policys_sentence_with_the_truth_against_a_proven_wrong_slip():
    problems = problem_family(TaskSpec(family="digits", max_operand=9))
    pairs = answer_pairs(problems, ANSWER_SENTENCE, 16, random.Random(0), prompt_suffix=" Be brief.")
    assert len({p.question for p in pairs}) == 16  # drawn without replacement
    by_question = {p.question + " Be brief.": p for p in problems}
    for pair in pairs:
        problem = by_question[pair.question]
        assert pair.reference == problem.reference and pair.right == f"The answer is {problem.reference}."
        assert verify_one(pair.reference, pair.right).verdict == Verdict.CORRECT
        assert verify_one(pair.reference, pair.wrong).verdict == Verdict.INCORRECT
        assert pair.wrong.startswith("The answer is ") and int(pair.wrong[14:-1]) >= 0


def test_training_on_pairs_ranks_the_truth_above_the_slips_and_exports_a_loadable_verifyrm(model_dir, tmp_path):
    """A few steps on the tiny RM at a high rate move its pair margin up on pairs it never trained on."""
    from cooper_openrlhf.rm.scorer import RMScorer

    problems = problem_family(TaskSpec(family="digits", max_operand=9))
    trained, held = problems[:60], problems[60:]
    pairs = answer_pairs(held, ANSWER_SENTENCE, 20, random.Random(1))

    def margin(rm) -> float:
        scorer = RMScorer.load(str(rm), batch_size=40)
        logits = scorer.logits([p.question for p in pairs] * 2, [p.reference for p in pairs] * 2,
                               [p.right for p in pairs] + [p.wrong for p in pairs])
        return sum(logits[:20]) / 20 - sum(logits[20:]) / 20

    start = model_dir("tiny-qwen2-rm")
    metrics = train_on_pairs(start, tmp_path / "rm", trained, ANSWER_SENTENCE, steps=30, lr=1e-3, pairs_per_step=8,
                             seed=0)
    assert set(metrics) == {"loss", "pair_accuracy", "margin", "valid"} and metrics["valid"] == 8
    assert margin(tmp_path / "rm") > margin(start) + 0.1  # 0.008 -> 0.18 when written
