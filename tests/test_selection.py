"""algo.selection on hand-built groups: positives, rollout negatives (hardest / random), mixed gaps, assembly."""

import pytest

from cooper_openrlhf.algo.pairs import NO_POSITIVE
from cooper_openrlhf.algo.selection import (
    NO_ROLLOUT,
    assemble_pairs,
    assistant_prompts,
    has_proven_wrong_rollout,
    pair_metrics,
    rollout_negative_candidates,
    select_positives,
    select_rollout_negatives,
)


def test_select_positives_takes_the_first_correct_rollout_of_each_prompt():
    # 3 prompts x 3 rollouts: prompt 0 correct at 1 and 2, prompt 1 none, prompt 2 at 0 only.
    verified = [False, True, True, False, False, False, True, False, False]
    assert select_positives(verified, 3) == [1, NO_POSITIVE, 6]
    assert select_positives([], 4) == []
    with pytest.raises(ValueError, match="groups of 2"):
        select_positives([True, False, True], 2)


def test_hardest_picks_the_wrong_rollout_the_rm_scores_highest_and_ignores_unproved_ones():
    # Prompt 0: rollouts 1 and 3 proved wrong; rollout 2 is unverifiable and scores highest: never picked.
    proven_wrong = [False, True, False, True, False, False, False, False]
    scores = [0.9, 0.3, 5.0, 0.7, 0.1, 0.2, 0.3, 0.4]
    assert select_rollout_negatives(proven_wrong, 4, scores, "hardest") == [3, NO_ROLLOUT]


def test_hardest_breaks_ties_by_batch_order_and_needs_scores():
    assert select_rollout_negatives([True, True], 2, [0.5, 0.5], "hardest") == [0]
    with pytest.raises(ValueError, match="one RM score per rollout"):
        select_rollout_negatives([True, True], 2, None, "hardest")
    with pytest.raises(ValueError, match="valid: \\['hardest', 'random'\\]"):
        select_rollout_negatives([True, True], 2, [0, 0], "easiest")


def test_random_pick_is_seeded_and_only_among_proved_wrong_rollouts():
    proven_wrong = [True, False, True, True] * 25
    picks = select_rollout_negatives(proven_wrong, 4, pick="random", seed=3)
    assert picks == select_rollout_negatives(proven_wrong, 4, pick="random", seed=3)
    assert all(proven_wrong[i] and i // 4 == p for p, i in enumerate(picks))
    assert {i % 4 for i in picks} == {0, 2, 3}  # every candidate gets chosen somewhere


def test_assistant_prompts_by_source():
    positive_index = [0, NO_POSITIVE, 6, 9]
    has_wrong = [True, True, False, False]
    assert assistant_prompts(positive_index, has_wrong, "assistant") == [0, 2, 3]
    assert assistant_prompts(positive_index, has_wrong, "mixed") == [2, 3]  # only the gaps
    assert assistant_prompts(positive_index, has_wrong, "rollout") == []
    with pytest.raises(ValueError, match="negative_source"):
        assistant_prompts(positive_index, has_wrong, "judge")


def test_assemble_masks_prompts_without_a_pair_and_never_keeps_an_unchanged_negative():
    completions = ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}", "x", "\\boxed{5}", "\\boxed{6}"]
    pairs = assemble_pairs(["A", "B", "C"], ["1", "3", "5"], completions, positive_index=[0, 2, 4],
                           rollout_negative=[1, NO_ROLLOUT, NO_ROLLOUT],
                           assistant_negatives={1: "\\boxed{4}", 2: "\\boxed{5}"}, source="mixed")
    assert pairs.valid == [True, True, False]  # C's rewrite is its positive unchanged
    assert pairs.negatives == ["\\boxed{2}", "\\boxed{4}", ""]
    assert pairs.negative_source == ["rollout", "assistant", ""]
    metrics = pair_metrics(pairs, has_proven_wrong_rollout([False, True, False, False, False, False], 2))
    assert metrics["cooper/valid_pair_rate"] == pytest.approx(2 / 3)
    assert metrics["cooper/pairs_from_rollout"] == pytest.approx(0.5)
    assert metrics["cooper/prompts_without_wrong_rollout"] == pytest.approx(2.0)


def test_a_pair_differs_only_where_the_rewrite_changed_it():
    positive = "Step 1: 2 + 3 = 5.\nSo the answer is \\boxed{5}.\nThanks for asking!<|im_end|>"
    rewrite = "Step 1: 2 + 3 = 6.\nSo the answer is \\boxed{6}."
    pairs = assemble_pairs(["Q"], ["5"], [positive], [0], [NO_ROLLOUT], {0: rewrite}, "assistant")
    pos_lines, neg_lines = pairs.positives[0].splitlines(), pairs.negatives[0].splitlines()
    assert len(pos_lines) == len(neg_lines) == 2  # the trailing chatter after the final box is gone from both
    assert [a == b for a, b in zip(pos_lines, neg_lines)] == [False, False]
    assert pos_lines[0].replace("5", "6") == neg_lines[0]


def test_a_batch_with_nothing_to_pair_is_all_masked():
    for correct, wrong in (([False] * 4, [True] * 4), ([True] * 4, [False] * 4), ([False] * 4, [False] * 4)):
        positive_index = select_positives(correct, 2)
        rollout_negative = select_rollout_negatives(wrong, 2, [0.0] * 4, "hardest")
        pairs = assemble_pairs(["A", "B"], ["1", "2"], ["\\boxed{9}"] * 4, positive_index, rollout_negative, {},
                               "rollout")
        assert pairs.num_valid == 0 and pair_metrics(pairs, [any(wrong)] * 2)["cooper/valid_pair_rate"] == 0.0


def test_answerless_rollouts_are_negative_candidates_only_when_asked_for():
    proven_wrong = [False, True, False, False]
    answerless = [False, False, True, False]  # a timeout or an error is neither: never a candidate
    assert rollout_negative_candidates(proven_wrong, answerless, include_answerless=False) == proven_wrong
    widened = rollout_negative_candidates(proven_wrong, answerless, include_answerless=True)
    assert widened == [False, True, True, False]
    # hardest then picks among them: here the answerless rollout the RM pays most for
    assert select_rollout_negatives(widened, 4, [0.0, 0.3, 0.8, 0.9], "hardest") == [2]
    with pytest.raises(ValueError, match="differ in length"):
        rollout_negative_candidates(proven_wrong, answerless[:3], include_answerless=True)
