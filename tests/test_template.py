"""RM input template: exact text, exact truncation boundaries, version lookup and recording."""

import pytest

from cooper_openrlhf.algo.negatives import normalize_solution
from cooper_openrlhf.algo.template import (
    TEMPLATE_VERSION,
    get_template,
    render_rm_input,
    template_config,
    template_from_config,
    truncate_middle,
)


def test_exact_rendering():
    text = render_rm_input("What is 1+1?", "2", "1+1 = \\boxed{2}")
    assert text == (
        "<question>What is 1+1?</question>\n"
        "<reference_answer>2</reference_answer>\n"
        "<completion>1+1 = \\boxed{2}</completion>"
    )


def test_the_rm_reads_a_completion_normalised():
    raw = "<think>try 3</think>Here is the solution:\n```\n1+1 = \\boxed{2}\nNote: easy\n```<|im_end|>junk"
    normalised = normalize_solution(raw)
    assert normalised == "1+1 = \\boxed{2}"
    assert render_rm_input("What is 1+1?", "2", raw) == render_rm_input("What is 1+1?", "2", normalised) == (
        "<question>What is 1+1?</question>\n"
        "<reference_answer>2</reference_answer>\n"
        "<completion>1+1 = \\boxed{2}</completion>"
    )


def test_truncation_boundaries():
    # 1500 characters is the longest text kept whole; 1501 loses exactly one character, the 501st.
    exactly = "".join(chr(ord("a") + i % 26) for i in range(1500))
    assert truncate_middle(exactly, 500, 1000, "\n...\n") == exactly
    longer = "H" * 500 + "X" + "T" * 1000
    assert truncate_middle(longer, 500, 1000, "\n...\n") == "H" * 500 + "\n...\n" + "T" * 1000
    # Position markers: keep characters [0, 500) and [len-1000, len).
    numbered = "".join(f"{i:05d}" for i in range(1000))  # 5000 chars, char i belongs to number i // 5
    cut = truncate_middle(numbered, 500, 1000, "|")
    head, tail = cut.split("|")
    assert head == numbered[:500] and head.endswith("00099")
    assert tail == numbered[4000:] and tail.startswith("00800")


def test_completion_and_reference_are_cut_but_not_the_question():
    question = "Q" * 3000
    reference = "R" * 1600
    completion = "C" * 499 + "c" + "M" * 7000 + "e" + "E" * 999
    text = render_rm_input(question, reference, completion)
    assert text == (
        f"<question>{question}</question>\n"
        f"<reference_answer>{'R' * 500}\n...\n{'R' * 1000}</reference_answer>\n"
        f"<completion>{'C' * 499}c\n...\ne{'E' * 999}</completion>"
    )


def test_version_lookup():
    assert TEMPLATE_VERSION == "verifyrm-v1"
    assert get_template("verifyrm-v1").head_chars == 500
    with pytest.raises(ValueError, match="valid: \\['verifyrm-v1'\\]"):
        render_rm_input("q", "r", "c", template_version="verifyrm-v0")


def test_template_config_round_trip():
    record = template_config()
    assert record["version"] == "verifyrm-v1"
    assert (record["head_chars"], record["tail_chars"], record["joiner"]) == (500, 1000, "\n...\n")
    assert template_from_config(record) == get_template("verifyrm-v1")
    with pytest.raises(ValueError, match="tail_chars"):
        template_from_config({**record, "tail_chars": 2000})
    with pytest.raises(ValueError, match="valid"):
        template_from_config({"version": "nope"})
