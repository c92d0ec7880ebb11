"""Rule verifier on real math: equivalent forms, near misses, no answer, answer equivalence, threads."""

import threading

import pytest

from cooper_openrlhf.verify.rule import (
    RuleVerifierConfig,
    Verdict,
    answers_equivalent,
    compare_answers,
    verify_one,
)

EQUIVALENT = [  # (reference, completion): math-verify must call these correct
    ("\\frac{1}{2}", "so \\boxed{0.5}"),
    ("0.5", "\\boxed{\\frac{1}{2}}"),
    ("\\frac{1}{3}", "\\boxed{0.333333}"),  # 6 decimals: math-verify's default float rounding
    ("\\frac{3}{4}", "The final answer is $\\frac{6}{8}$. I hope it is correct."),
    ("\\{1,2\\}", "\\boxed{\\{2,1\\}}"),  # sets ignore order
    ("1, 2", "\\boxed{2, 1}"),  # a bare list of answers is a set
    ("(1,2]", "\\boxed{(1, 2]}"),
    ("(2,12) \\cup (12,102)", "\\boxed{(12,102) \\cup (2,12)}"),
    ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\sqrt{2}/2}"),
    ("50\\%", "\\boxed{50}"),  # math-verify accepts a percent with or without the sign
    ("50\\%", "\\boxed{0.5}"),
    ("10 \\text{ cm}", "\\boxed{10}"),  # \text units are dropped
    ("76^\\circ", "\\boxed{76}"),
    ("1000", "#### 1,000"),  # thousands separator
    ("18", "She makes $18 every day.\n#### 18"),
    ("x=2", "\\boxed{2}"),  # an assignment in the reference matches its value
    ("3", "\\boxed{3.0}"),
    ("6+9i", "\\boxed{9i+6}"),
    ("\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}", "\\boxed{\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}}"),
    ("\\text{(C)}", "\\boxed{C}"),
]

NEAR_MISSES = [  # (reference, completion): close but wrong
    ("\\frac{1}{3}", "\\boxed{0.333}"),  # too few decimals
    ("(1,2]", "\\boxed{[1,2]}"),  # closed vs half-open interval
    ("18", "#### 19"),
    ("\\sqrt{2}", "\\boxed{2}"),
    ("\\{1,2\\}", "\\boxed{\\{1,2,3\\}}"),
    ("-5", "\\boxed{5}"),
    ("2\\pi", "\\boxed{\\pi}"),
    ("18", "The answer is 18 \\boxed{17}"),  # the box is the answer, not an earlier number
]


@pytest.mark.parametrize("reference, completion", EQUIVALENT)
def test_equivalent_forms_are_correct(reference, completion):
    assert verify_one(reference, completion).verdict == Verdict.CORRECT


@pytest.mark.parametrize("reference, completion", NEAR_MISSES)
def test_near_misses_are_incorrect(reference, completion):
    assert verify_one(reference, completion).verdict == Verdict.INCORRECT


def test_no_answer():
    assert verify_one("5", "I am not sure.").verdict == Verdict.NO_ANSWER
    assert verify_one("5", "\\boxed{}").verdict == Verdict.NO_ANSWER
    # With fallback "none" a bare number is not taken as the answer.
    config = RuleVerifierConfig(answer_fallback="none")
    assert verify_one("5", "It is 5", config).verdict == Verdict.NO_ANSWER
    assert verify_one("5", "It is 5").verdict == Verdict.CORRECT


def test_outcome_carries_extracted_answer_and_time():
    outcome = verify_one("\\frac{1}{2}", "Thus \\boxed{0.25}.")
    assert outcome.extracted == "0.25" and outcome.verdict == Verdict.INCORRECT
    # The string is math-verify's normalised form of what it graded (it writes 0.5 as a fraction).
    assert verify_one("\\frac{1}{2}", "Thus \\boxed{0.5}.").extracted == "\\frac{1}{2}"
    assert 0 <= outcome.seconds < 5


def test_bad_arguments_raise():
    with pytest.raises(TypeError):
        verify_one(5, "\\boxed{5}")
    with pytest.raises(ValueError, match="empty"):
        verify_one("  ", "\\boxed{5}")
    with pytest.raises(ValueError, match="last_number"):
        RuleVerifierConfig(answer_fallback="first")


def test_reference_is_gold():
    # Direct check of the argument order: an equation on the gold side is simplified to its value.
    assert compare_answers("y = 3", "3") == Verdict.CORRECT


def test_answers_equivalent():
    assert answers_equivalent("\\frac{1}{2}", "0.5") is True
    assert answers_equivalent("0.5", "\\frac{1}{2}") is True
    assert answers_equivalent("\\{1,2\\}", "\\{2,1\\}") is True
    assert answers_equivalent("3", "4") is False
    assert answers_equivalent("x=2", "2") is True
    assert answers_equivalent("2", "x=2") is True  # either side may be gold: equal if either says so
    assert answers_equivalent("3", "") is None  # undecided: a rewrite without an answer is not "different"


def test_verify_one_works_outside_the_main_thread():
    # math-verify's signal.alarm raises there; verify_one must switch it off instead.
    results = {}

    def run():
        results["outcome"] = verify_one("\\frac{1}{2}", "\\boxed{0.5}")

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert results["outcome"].verdict == Verdict.CORRECT


# (reference, completion, verdict, extracted): a final answer that is arithmetic on numerals. Graded as its value
# (math-verify's semantics) any policy that restates the question's expression is paid on every problem; the first
# two are SmolLM2's own, written under the rule reward (policy-response pilot 3's held-out samples, trimmed): the
# result each states for its expression elsewhere is what is graded.
UNEVALUATED = [
    ("3", "We first calculate 9 - 6 = 5.\n\nThe final answer is 9 - 6 = 5.\n\nThe answer is 9 - 6.", Verdict.INCORRECT,
     "5"),
    ("9", "we have a total of 7 + 2 = 11.\n\nThe final answer is 81.\n\nThe final answer is 7 + 2 = ", Verdict.INCORRECT,
     "11"),
    ("4", "The final answer is 7 + 2 = ", Verdict.INCORRECT, "7 + 2"),  # no result stated for it
    ("4", "The final answer is 9 - 5 = 7.", Verdict.INCORRECT, "7"),  # the result stated for it is graded
    ("4", "The final answer is 9 - 5 = 4.", Verdict.CORRECT, "4"),
    ("4", "\\boxed{9-5}", Verdict.INCORRECT, "9-5"),
    ("12", "The answer is $3 \\cdot 4$", Verdict.INCORRECT, "3 \\cdot 4"),
    ("4", "The final answer is 9 - 5 = 4 - 0.", Verdict.INCORRECT, "9 - 5"),  # a result that is arithmetic again
    ("4", "19 - 5 = 14, and the final answer is 9 - 5.", Verdict.INCORRECT, "9 - 5"),  # 14 is 19 - 5's result
]


@pytest.mark.parametrize("reference, completion, verdict, extracted", UNEVALUATED)
def test_arithmetic_on_numerals_is_not_an_answer_the_result_written_after_it_is(reference, completion, verdict,
                                                                                 extracted):
    outcome = verify_one(reference, completion)
    assert (outcome.verdict, outcome.extracted) == (verdict, extracted)


@pytest.mark.parametrize("reference, completion", [
    ("\\frac{3}{4}", "The answer is 3/4"),  # a fraction is an answer's form, not a computation left over
    ("-3", "The answer is -3"),
    ("1+\\sqrt{2}", "The answer is $1+\\sqrt{2}$"),
    ("6+9i", "\\boxed{9i+6}"),
    ("12", "The answer is $3 \\cdot 4 = 12$"),
])
def test_answers_that_merely_contain_an_operator_keep_math_verifys_grade(reference, completion):
    assert verify_one(reference, completion).verdict == Verdict.CORRECT


def test_math_verifys_own_grade_of_arithmetic_stays_one_setting_away():
    config = RuleVerifierConfig(grade_unevaluated_arithmetic=True)
    for reference, completion, _, _ in UNEVALUATED[:2] + UNEVALUATED[3:4] + UNEVALUATED[5:7]:
        assert verify_one(reference, completion, config).verdict == Verdict.CORRECT, completion
