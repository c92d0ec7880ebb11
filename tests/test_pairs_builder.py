"""PairBuilder with a scripted assistant and the REAL VerifierPool: hand-worked pairs, retries and metrics."""

import logging

import pytest

from cooper_openrlhf.algo.negatives import NegativeConfig
from cooper_openrlhf.algo.pairs import NO_POSITIVE
from cooper_openrlhf.engines.base import GenerationEngine
from cooper_openrlhf import core
from cooper_openrlhf.core import PairConfig, RolloutTexts, RolloutVerdicts
from cooper_openrlhf.core.pair_builder import SEED_STRIDE, PairBuilder
from cooper_openrlhf.verify.pool import VerifierPool
from cooper_openrlhf.verify.rule import RuleVerifierConfig

# 1.5 s hard deadline: the "undecided" test needs a comparison that times out; ordinary items take ms.
DEADLINE_S = 1.5


@pytest.fixture(scope="module")
def pool():
    config = RuleVerifierConfig(answer_fallback="none", parse_timeout_s=1, compare_timeout_s=1)
    with VerifierPool(num_workers=2, deadline_s=DEADLINE_S, config=config) as shared_pool:
        yield shared_pool


class ScriptedAssistant:
    """Replies from a script: the k-th time a question is asked, it gets script[question][k].

    Records every generate call as (questions asked, sampling) to check batching and seeds.
    """

    def __init__(self, script: dict[str, list[str]]):
        self.script = script
        self.asked = {question: 0 for question in script}
        self.calls = []

    def generate(self, prompts, sampling):
        questions = []
        for messages in prompts:
            user = messages[-1]["content"]
            question = user.split("Problem:\n", 1)[1].split("\n\nCorrect solution:", 1)[0]
            questions.append(question)
        self.calls.append((questions, sampling))
        replies = []
        for question in questions:
            replies.append(self.script[question][self.asked[question]])
            self.asked[question] += 1
        return replies


def flat(questions_refs: list[tuple[str, str]], n: int) -> tuple[list[str], list[str]]:
    """Repeat each prompt's (question, reference) for its n rollouts, as OpenRLHF lays them out."""
    return [q for q, _ in questions_refs for _ in range(n)], [r for _, r in questions_refs for _ in range(n)]


def build_pairs(pair_builder, questions, references, completions, verified_correct, n, step=None, *, proven_wrong=None,
                answerless=None, answerless_negatives=False, rm_scores=None, source="assistant", pick="hardest"):
    """One step's pairs through the core's serial pipeline (`core.build_pairs`) over `pair_builder`'s verifier and
    assistant, as the reward service runs it; step None: the builder's own count of rewrite calls."""
    blank = [False] * len(completions)
    verdicts = RolloutVerdicts(list(verified_correct), blank if proven_wrong is None else list(proven_wrong),
                               blank if answerless is None else list(answerless))
    config = PairConfig(n, source, pick, answerless_negatives, seed=pair_builder.config.seed)
    return core.build_pairs(config, RolloutTexts(list(questions), list(references), list(completions)), verdicts,
                            rm_scores, pair_builder.assistant_negatives, pair_builder.calls if step is None else step)


def builder(pool, script, **config) -> tuple[PairBuilder, ScriptedAssistant]:
    assistant = ScriptedAssistant(script)
    assert isinstance(assistant, GenerationEngine)
    return PairBuilder(pool, assistant, NegativeConfig(**config)), assistant


def test_verify_marks_only_correct_verdicts_and_counts(pool):
    pairs, _ = builder(pool, {})
    references = ["5", "5", "1/2", "7", "7"]
    completions = ["so \\boxed{5}", "the answer is 6", "\\boxed{0.5}", "I give up", "\\boxed{7.0}"]
    verdicts, metrics = pairs.verify(references, completions)
    assert verdicts.correct == [True, False, True, False, True]
    assert verdicts.proven_wrong == [False, True, False, False, False]  # "I give up" is not proved anything
    assert metrics["cooper/verified_accuracy"] == pytest.approx(3 / 5)
    assert metrics["cooper/verify_no_answer"] == pytest.approx(1.0)
    assert metrics["cooper/verify_proven_wrong"] == pytest.approx(1.0)
    assert metrics["cooper/verify_timeouts"] == pytest.approx(0.0)
    assert metrics["cooper/verify_errors"] == pytest.approx(0.0)
    assert metrics["timing/cooper_verify"] > 0
    empty, empty_metrics = pairs.verify([], [])
    assert empty.correct == [] and empty_metrics["cooper/verified_accuracy"] == pytest.approx(0.0)


def test_positives_need_an_explicit_final_answer_unless_the_lax_rule_is_asked_for(pool):
    # An unboxed (or truncated) rollout whose last number equals the reference.
    references, completions = ["12", "12"], ["We have 4 boxes of 3, that makes 12", "\\boxed{12}"]
    strict, _ = builder(pool, {})
    verdicts, metrics = strict.verify(references, completions)
    assert verdicts.correct == [False, True]
    assert metrics["cooper/verify_fallback_only_correct"] == pytest.approx(1.0)  # counted, not accepted
    with VerifierPool(num_workers=1, deadline_s=DEADLINE_S, config=RuleVerifierConfig(answer_fallback="last_number")) as lax_pool:
        lax = PairBuilder(lax_pool, ScriptedAssistant({}), NegativeConfig(), answer_fallback="last_number")
        lax_verdicts, lax_metrics = lax.verify(references, completions)
    assert lax_verdicts.correct == [True, True]
    assert lax_metrics["cooper/verify_fallback_only_correct"] == pytest.approx(1.0)  # accepted, and counted


def test_a_wrong_rollout_is_a_negative_only_when_its_answer_is_proved_different(pool):
    # Rollout 0 is wrong (4 != 3); rollout 1 has no answer; rollout 2 timed out on a power tower; 3 is correct.
    references = ["3"] * 4
    completions = ["so \\boxed{4}", "no idea", "\\boxed{9^{9^{9^{9}}}}", "\\boxed{3}"]
    verdicts, _ = builder(pool, {})[0].verify(references, completions)
    assert verdicts.correct == [False, False, False, True]
    assert verdicts.proven_wrong == [True, False, False, False]
    assert verdicts.answerless == [False, True, False, False]  # the timeout is not answerless


def test_rollout_and_mixed_sources_pick_the_hardest_wrong_rollout_and_fill_only_the_gaps(pool):
    # Prompt A: positive 0, wrong rollouts 1 (score 0.2) and 2 (score 0.9). Prompt B: positive 3, no wrong rollout.
    questions, references = flat([("A?", "5"), ("B?", "7")], n=3)
    completions = ["\\boxed{5}", "\\boxed{6}", "\\boxed{8}\nextra line", "\\boxed{7}", "no answer", "\\boxed{7}"]
    verdicts, _ = builder(pool, {})[0].verify(references, completions)
    assert verdicts.proven_wrong == [False, True, True, False, False, False]
    scores = [0.0, 0.2, 0.9, 0.0, 0.0, 0.0]
    common = dict(proven_wrong=verdicts.proven_wrong, rm_scores=scores)

    only_rollouts, assistant = builder(pool, {})
    batch, metrics = build_pairs(only_rollouts, questions, references, completions, verdicts.correct, 3,
                                               source="rollout", **common)
    assert assistant.calls == []  # no generation at all
    assert batch.negatives == ["\\boxed{8}", ""] and batch.valid == [True, False]  # normalised like the positive
    assert batch.negative_source == ["rollout", ""]
    assert metrics["cooper/pairs_from_rollout"] == pytest.approx(1.0)
    assert metrics["cooper/prompts_without_wrong_rollout"] == pytest.approx(1.0)

    mixed, assistant = builder(pool, {"B?": ["\\boxed{70}"]})
    batch, metrics = build_pairs(mixed, questions, references, completions, verdicts.correct, 3, source="mixed", **common)
    assert [asked for asked, _ in assistant.calls] == [["B?"]]  # only the prompt without a wrong rollout
    assert batch.negative_source == ["rollout", "assistant"] and batch.valid == [True, True]
    assert metrics["cooper/pairs_from_assistant"] == pytest.approx(0.5)


def test_pairs_retries_only_missing_prompts_and_rejects_same_answer_in_another_form(pool):
    # 3 prompts x 2 rollouts. Prompt A: positive is rollout 1 (rollout 0 wrong). Prompt B: no
    # correct rollout. Prompt C: both correct, the positive is the first (flat index 4).
    questions, references = flat([("A?", "0.5"), ("B?", "3"), ("C?", "10")], n=2)
    completions = ["\\boxed{2}", "half: \\boxed{0.5}", "\\boxed{4}", "\\boxed{5}", "C1 \\boxed{10}", "C2 \\boxed{10}"]
    verified = [False, True, False, False, True, True]
    script = {
        # A's first rewrite only restates 0.5 as 1/2: the same answer, rejected; its second is valid.
        "A?": ["so it is \\boxed{\\frac{1}{2}}", "half is \\boxed{0.25}"],
        "C?": ["C wrong \\boxed{11}\nNote: changed it"],
    }
    pairs, assistant = builder(pool, script, retries=3, seed=7)
    batch, metrics = build_pairs(pairs, questions, references, completions, verified, 2)

    assert batch.questions == ["A?", "B?", "C?"] and batch.references == ["0.5", "3", "10"]
    assert batch.positive_index == [1, NO_POSITIVE, 4]
    assert batch.positives == ["half: \\boxed{0.5}", "", "C1 \\boxed{10}"]
    assert batch.negatives == ["half is \\boxed{0.25}", "", "C wrong \\boxed{11}"]  # cleaned: the note is gone
    assert batch.valid == [True, False, True]
    # Attempt 0 asks A and C in one call; attempt 1 asks only A; no third call.
    assert [asked for asked, _ in assistant.calls] == [["A?", "C?"], ["A?"]]
    assert [s.seed for _, s in assistant.calls] == [7, 7 + SEED_STRIDE]  # step 0, attempts 0 and 1
    assert all(s.n == 1 and s.temperature == pytest.approx(1.0) for _, s in assistant.calls)
    assert metrics["cooper/prompts_with_positive"] == pytest.approx(2.0)
    assert metrics["cooper/valid_pair_rate"] == pytest.approx(2 / 3)
    assert metrics["cooper/negative_success_rate"] == pytest.approx(1.0)
    assert metrics["cooper/negative_attempts"] == pytest.approx(3.0)
    assert metrics["cooper/negative_rejected_same_answer"] == pytest.approx(1.0)
    assert metrics["cooper/negative_rejected_no_answer"] == pytest.approx(0.0)
    assert metrics["cooper/negative_rejected_undecided"] == pytest.approx(0.0)
    assert metrics["timing/cooper_negatives"] > 0


def test_rewrites_without_an_answer_are_rejected_and_retries_stop_at_the_limit(pool):
    questions, references = flat([("A?", "12"), ("B?", "7")], n=1)
    script = {
        "A?": ["I cannot help with that.", "<|im_end|>", "The answer is \\boxed{}"],  # never an answer
        "B?": ["\\boxed{7}", "7 + 0 = \\boxed{7.0}", "so \\boxed{8}"],  # valid on the last attempt
    }
    pairs, assistant = builder(pool, script, retries=3)
    batch, metrics = build_pairs(pairs, questions, references, ["\\boxed{12}", "\\boxed{7}"], [True, True], 1)
    assert batch.valid == [False, True] and batch.negatives == ["", "so \\boxed{8}"]
    assert [asked for asked, _ in assistant.calls] == [["A?", "B?"], ["A?", "B?"], ["A?", "B?"]]
    assert metrics["cooper/negative_attempts"] == pytest.approx(6.0)
    assert metrics["cooper/negative_rejected_no_answer"] == pytest.approx(3.0)
    assert metrics["cooper/negative_rejected_same_answer"] == pytest.approx(2.0)
    assert metrics["cooper/valid_pair_rate"] == pytest.approx(0.5)
    assert metrics["cooper/negative_success_rate"] == pytest.approx(0.5)


def test_a_rewrite_must_state_its_answer_unless_last_number_is_asked_for(pool):
    questions, references = flat([("A?", "12")], n=1)
    rambling = ["We have 12 apples and 3 friends, so each gets 5 or so."]  # last number 5, no stated answer
    strict, _ = builder(pool, {"A?": rambling}, retries=1)
    batch, metrics = build_pairs(strict, questions, references, ["\\boxed{12}"], [True], 1)
    assert batch.valid == [False] and metrics["cooper/negative_rejected_no_answer"] == pytest.approx(1.0)
    lenient, _ = builder(pool, {"A?": rambling}, retries=1, answer_fallback="last_number")
    batch, _ = build_pairs(lenient, questions, references, ["\\boxed{12}"], [True], 1)
    assert batch.valid == [True] and batch.negatives == rambling
    with pytest.raises(ValueError, match="config.answer_fallback"):
        builder(pool, {}, answer_fallback="first_number")


def test_an_undecided_comparison_is_rejected(pool):
    # math-verify cannot finish comparing a power tower: the pool's deadline gives "undecided".
    pairs, _ = builder(pool, {"A?": ["\\boxed{9^{9^{9^{9}}}}"]}, retries=1)
    batch, metrics = build_pairs(pairs, ["A?"], ["5"], ["\\boxed{5}"], [True], 1)
    assert batch.valid == [False]
    assert metrics["cooper/negative_rejected_undecided"] == pytest.approx(1.0)
    assert metrics["cooper/negative_success_rate"] == pytest.approx(0.0)


def test_a_step_without_any_correct_rollout_gives_all_invalid_pairs_and_zero_metrics(pool):
    questions, references = flat([("A?", "1"), ("B?", "2")], n=2)
    pairs, assistant = builder(pool, {})
    batch, metrics = build_pairs(pairs, questions, references, ["x"] * 4, [False] * 4, 2)
    assert len(batch) == 2 and batch.valid == [False, False] and batch.num_valid == 0
    assert batch.positives == ["", ""] and batch.negatives == ["", ""] and batch.positive_index == [-1, -1]
    assert assistant.calls == []  # nothing to rewrite: the assistant is not asked
    for key in ("prompts_with_positive", "valid_pair_rate", "negative_success_rate", "negative_attempts"):
        assert metrics[f"cooper/{key}"] == pytest.approx(0.0)
    empty, empty_metrics = build_pairs(pairs, [], [], [], [], 4)
    assert len(empty) == 0 and empty_metrics["cooper/valid_pair_rate"] == pytest.approx(0.0)


def test_an_assistant_that_never_writes_a_valid_negative_gives_rate_zero_and_a_warning(pool, caplog):
    questions, references = flat([("A?", "4"), ("B?", "9")], n=2)
    echo = {"A?": ["2 + 2 = \\boxed{4}"] * 2, "B?": ["3 * 3 = \\boxed{9}"] * 2}  # always the same answer
    pairs, assistant = builder(pool, echo, retries=2)
    with caplog.at_level(logging.WARNING, logger="cooper_openrlhf.algo.selection"):
        batch, metrics = build_pairs(pairs, questions, references, ["\\boxed{4}", "x", "y", "\\boxed{9}"],
                                           [True, False, False, True], 2)
    assert batch.valid == [False, False] and batch.positive_index == [0, 3]
    assert len(assistant.calls) == 2
    assert metrics["cooper/prompts_with_positive"] == pytest.approx(2.0)
    assert metrics["cooper/valid_pair_rate"] == pytest.approx(0.0)
    assert metrics["cooper/negative_success_rate"] == pytest.approx(0.0)
    assert metrics["cooper/negative_attempts"] == pytest.approx(4.0)
    assert metrics["cooper/negative_rejected_same_answer"] == pytest.approx(4.0)
    assert "no valid negative for any of 2 prompts" in caplog.text


def test_seeds_follow_the_step_so_a_step_is_reproducible(pool):
    script = {"A?": ["\\boxed{2}"] * 6}  # never valid: every call makes both attempts
    pairs, assistant = builder(pool, script, retries=2, seed=3)
    args = (["A?"], ["2"], ["\\boxed{2}"], [True], 1)
    build_pairs(pairs, *args)  # internal counter: step 0
    build_pairs(pairs, *args)  # step 1
    build_pairs(pairs, *args, step=0)  # explicit step: the same seeds as the first call
    seeds = [s.seed for _, s in assistant.calls]
    assert seeds == [3, 3 + SEED_STRIDE, 3 + 2 * SEED_STRIDE, 3 + 3 * SEED_STRIDE, 3, 3 + SEED_STRIDE]
    with pytest.raises(ValueError, match="step"):
        build_pairs(pairs, *args, step=-1)


def test_bad_input_is_rejected_with_the_offending_prompt(pool):
    pairs, _ = builder(pool, {})
    with pytest.raises(ValueError, match="lengths"):
        build_pairs(pairs, ["A?", "A?"], ["1"], ["a", "b"], [True, False], 2)
    with pytest.raises(ValueError, match="groups of 2"):
        build_pairs(pairs, ["A?"] * 3, ["1"] * 3, ["a"] * 3, [True] * 3, 2)
    with pytest.raises(ValueError, match="prompt 1: its 2 rollouts carry different questions"):
        build_pairs(pairs, ["A?", "A?", "B?", "C?"], ["1"] * 4, ["a"] * 4, [False] * 4, 2)
    with pytest.raises(ValueError, match="answer_fallback"):
        PairBuilder(pool, ScriptedAssistant({}), NegativeConfig(), answer_fallback="first_number")


def test_a_short_assistant_reply_list_is_an_error_not_a_silent_gap(pool):
    class Truncating(ScriptedAssistant):
        def generate(self, prompts, sampling):
            return super().generate(prompts, sampling)[:-1]

    pairs = PairBuilder(pool, Truncating({"A?": ["\\boxed{1}"], "B?": ["\\boxed{1}"]}), NegativeConfig())
    with pytest.raises(RuntimeError, match="1 replies for 2 prompts"):
        build_pairs(pairs, ["A?", "B?"], ["2", "3"], ["\\boxed{2}", "\\boxed{3}"], [True, True], 1)


def test_the_official_rule_keeps_every_rewrite_not_proved_equal_answerless_and_undecided_ones_included(pool):
    """--cooper.negative_validity official (the Cooper recipe's rule) against the strict default, on one script."""
    questions, references = flat([("A?", "12"), ("B?", "7"), ("C?", "5")], n=1)
    script = {"A?": ["I cannot help with that."], "B?": ["7 + 0 = \\boxed{7.0}"], "C?": ["\\boxed{9^{9^{9^{9}}}}"]}
    completions = ["\\boxed{12}", "\\boxed{7}", "\\boxed{5}"]
    strict, _ = builder(pool, script, retries=1)
    batch, metrics = build_pairs(strict, questions, references, completions, [True] * 3, 1)
    assert batch.valid == [False, False, False] and metrics["cooper/negative_accepted_answerless"] == 0.0
    official, _ = builder(pool, script, retries=1, validity="official")
    batch, metrics = build_pairs(official, questions, references, completions, [True] * 3, 1)
    assert batch.valid == [True, False, True]  # answerless and undecided kept; the same answer (7.0) never
    assert batch.negatives[0] == "I cannot help with that."
    assert metrics["cooper/negative_accepted_answerless"] == pytest.approx(1.0)
    assert metrics["cooper/negative_accepted_undecided"] == pytest.approx(1.0)
    assert metrics["cooper/negative_rejected_same_answer"] == pytest.approx(1.0)
