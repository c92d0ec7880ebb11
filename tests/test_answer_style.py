"""Answer sentences with fields (algo/answer_style.py): the style lab's S, a hedge's right and wrong twins."""

from cooper_openrlhf.algo.answer_style import in_sentence, is_hedge, right_in, stem_and_tail, wrong_in
from cooper_openrlhf.verify.rule import Verdict, verify_one

HEDGE = "The answer is {other}. The answer is {answer}."
CANONICAL = "The answer is {answer}."
BOXED = "The final answer is \\boxed{{{answer}}}."


def test_a_hedges_wrong_twin_keeps_the_reference_and_the_verifier_grades_the_last_number():
    right, wrong = right_in(HEDGE, 12, 13), wrong_in(HEDGE, 12, 13)
    assert (right, wrong) == ("The answer is 13. The answer is 12.", "The answer is 12. The answer is 13.")
    assert verify_one("12", right).verdict == Verdict.CORRECT and verify_one("12", wrong).verdict == Verdict.INCORRECT


def test_a_one_field_sentence_is_written_as_format_writes_it():
    assert not is_hedge(CANONICAL) and is_hedge(HEDGE)
    assert right_in(CANONICAL, 12, 13) == "The answer is 12." and wrong_in(CANONICAL, 12, 13) == "The answer is 13."
    assert right_in(BOXED, 7, 8) == "The final answer is \\boxed{7}."


def test_in_sentence_takes_any_integers_in_the_fields_and_nothing_else():
    assert in_sentence(" The answer is -3. The answer is 40. ", HEDGE)
    assert not in_sentence("The answer is 3.", HEDGE) and not in_sentence("The answer is 3. The answer is 4.", CANONICAL)
    assert not in_sentence("The answer is x. The answer is 4.", HEDGE)
    assert in_sentence("The final answer is \\boxed{5}.", BOXED) and in_sentence("#### 5", "#### {answer}")


def test_stem_and_tail_are_the_formatted_text_around_the_numbers():
    assert stem_and_tail(HEDGE) == ("The answer is ", ".")
    assert stem_and_tail(BOXED) == ("The final answer is \\boxed{", "}.")


def test_field_values_read_each_fields_number_and_the_exploit_form_is_the_hedge_stating_the_reference_first():
    from cooper_openrlhf.algo.answer_style import field_values, is_exploit_form

    assert field_values(" The answer is 12. The answer is -3. ", HEDGE) == {"other": "12", "answer": "-3"}
    assert field_values("The final answer is \\boxed{5}.", BOXED) == {"answer": "5"}
    assert field_values("The answer is 12.", HEDGE) is None and field_values("The answer is x.", CANONICAL) is None
    assert is_exploit_form(wrong_in(HEDGE, 12, 13), HEDGE, "12")  # the wrong twin: the reference first
    assert not is_exploit_form(right_in(HEDGE, 12, 13), HEDGE, "12")  # right: graded by its last number
    assert not is_exploit_form("The answer is 14. The answer is 13.", HEDGE, "12")  # wrong, but no reference
    assert not is_exploit_form("The answer is 13.", CANONICAL, "12")  # one field: no hedge, no such form
