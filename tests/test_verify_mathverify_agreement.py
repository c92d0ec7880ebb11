"""The rule verifier keeps math-verify's semantics: it agrees with plain `parse` + `verify` (reference as gold).

Plain math-verify here is what its README shows: ``verify(parse(gold), parse(completion))``, the
reference written as ``\\boxed{reference}`` so that a bare reference such as ``\\sqrt{2}`` parses.
Agreement is required in both directions on math-verify-style completions: no CORRECT that
math-verify rejects, no CORRECT lost where math-verify accepts. The verifier's own additions
(GSM8K's ``####`` line, a bare LaTeX "the answer is X") are checked separately: they only apply
where math-verify finds nothing or would take a number after the marker.
"""

import pytest

from cooper_openrlhf.verify.rule import RuleVerifierConfig, Verdict, verify_one

# (reference, completion): forms math-verify documents, right and wrong answers mixed.
MATH_VERIFY_STYLE = [
    ("\\frac{1}{3}", "The result is $\\frac13$."),
    ("\\frac{1}{3}", "So we get $\\frac14$."),
    ("1000", "In total 1 000 people came."),
    ("1000", "In total 1 001 people came."),
    ("0.4", "The probability is .4"),
    ("\\frac{2}{5}", "The probability is .4"),
    ("x \\geq 5", "Therefore $x \\geq 5$."),
    ("x \\geq 5", "Therefore $x > 5$."),
    ("[0,9)", "The range is $[0,9)$."),
    ("(0,9)", "The range is $[0,9)$."),
    ("(0,9)", "The range is [0,9)"),
    ("2", "so x = \\frac{1+\\sqrt{5}}{2}"),
    ("\\frac{1+\\sqrt{5}}{2}", "so x = $\\frac{1+\\sqrt{5}}{2}$"),
    ("1024", "\\boxed{1024"),
    ("1024", "The number is \\boxed{1024}."),
    ("1024", "\\boxed{1024}, checking: 2^10 = 1024 and 3 more"),
    ("\\frac{1}{2}", "\\boxed{0.5}"),
    ("\\frac{1}{2}", "\\boxed{\\frac{2}{4}}"),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}"),
    ("\\{1,2\\}", "\\boxed{\\{2,1\\}}"),
    ("(1,2]", "\\boxed{[1,2]}"),
    ("(1,2]", "\\boxed{(1, 2]}"),
    ("50\\%", "The answer is 50%"),
    ("50", "Final answer: 50 percent"),
    ("12", "The final answer is $12$. I hope it is correct."),
    ("12", "The final answer is $13$. I hope it is correct."),
    ("3", "Answer: 3 apples, since 6/2 = 3"),
    ("-7", "I got 3, then 4.5 and finally -7."),
    ("7", "I got 3, then 4.5 and finally -7."),
    ("\\sqrt{2}", "\\boxed{\\sqrt{2}}"),
    ("\\sqrt{2}", "$\\sqrt{2}$ is the length"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}"),
    ("6+9i", "\\boxed{9i+6}"),
    ("x=2", "\\boxed{2}"),
    ("2", "\\boxed{x = 2}"),
    ("10", "\\boxed{10 \\text{ cm}}"),
    ("\\pi", "\\boxed{3.14}"),
    ("20", "Solve it within \\boxed{}.\n17 + 3 = 20\n\nThe answer is: 20"),  # the instruction echoed (SmolLM2)
    ("18", "No idea."),
    ("18", ""),
]


def plain_math_verify(reference: str, completion: str) -> bool:
    from math_verify import parse, verify

    return verify(parse(f"\\boxed{{{reference}}}"), parse(completion))


@pytest.mark.parametrize("reference, completion", MATH_VERIFY_STYLE)
def test_agrees_with_plain_math_verify(reference, completion):
    expected = plain_math_verify(reference, completion)
    verdict = verify_one(reference, completion).verdict
    assert (verdict == Verdict.CORRECT) == expected, (verdict, expected)


@pytest.mark.parametrize(
    "reference, completion",
    [
        ("(0,9)", "The answer is [0,9)"),  # interval brackets matter
        ("(0,9)", "\\boxed{[0,9)}"),
        ("2", "x = \\frac{1+\\sqrt{5}}{2}"),  # not the last number of an unboxed fraction
        ("2", "The answer is \\frac{1+\\sqrt{5}}{2}"),
        ("1024", "so the result is \\boxed{1024"),  # an unclosed box is no answer
    ],
)
def test_former_false_positives_are_gone(reference, completion):
    assert verify_one(reference, completion).verdict != Verdict.CORRECT
    assert plain_math_verify(reference, completion) is False


def test_additions_where_math_verify_finds_nothing_or_a_later_number():
    # GSM8K: the `####` line is the answer, not the rightmost number after it.
    assert verify_one("18", "She earns 18 dollars.\n#### 18\nCheck: 3 bags of 5").verdict == Verdict.CORRECT
    assert plain_math_verify("18", "She earns 18 dollars.\n#### 18\nCheck: 3 bags of 5") is False
    # Bare LaTeX after "the answer is": math-verify's patterns need $...$ there.
    assert plain_math_verify("\\sqrt{2}", "The answer is \\sqrt{2}.") is False
    assert verify_one("\\sqrt{2}", "The answer is \\sqrt{2}.").verdict == Verdict.CORRECT
    assert verify_one("\\sqrt{3}", "The answer is \\sqrt{2}.").verdict == Verdict.INCORRECT
    # ... but never prose: "18 because ..." is left to math-verify, which takes its number.
    assert verify_one("\\frac{1}{2}", "The answer is \\frac{1}{2} because of symmetry").verdict == Verdict.CORRECT


def test_fallback_none_keeps_only_anchored_answers():
    strict = RuleVerifierConfig(answer_fallback="none")
    assert verify_one("5", "It is 5", strict).verdict == Verdict.NO_ANSWER
    assert verify_one("5", "Answer: 5", strict).verdict == Verdict.CORRECT
    assert verify_one("5", "#### 5", strict).verdict == Verdict.CORRECT
    assert verify_one("5", "so $x=5$ done", strict).verdict == Verdict.NO_ANSWER
    assert verify_one("5", "so $x=5$ done").verdict == Verdict.CORRECT
