"""algo.negatives: the rewrite prompt, the solution normalisation both sides of a pair share, NegativeConfig."""

import pytest

from cooper_openrlhf.algo.negatives import NegativeConfig, build_rewrite_messages, normalize_solution


def test_rewrite_messages_carry_question_solution_and_answer_to_avoid():
    messages = build_rewrite_messages("  What is 2 + 3?\n", "2 + 3 = 5.\n\\boxed{5}\n", positive_answer="5")
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert "Problem:\nWhat is 2 + 3?\n\nCorrect solution:\n2 + 3 = 5.\n\\boxed{5}\n\n" in user
    assert "the correct final answer is 5; yours must be different" in user
    assert "\\boxed{}" in user  # the format instruction survives str.format's brace escaping
    assert "correct final answer" not in build_rewrite_messages("Q", "S \\boxed{1}")[1]["content"]
    with pytest.raises(ValueError, match="empty"):
        build_rewrite_messages("Q", "  \n")
    with pytest.raises(TypeError):
        build_rewrite_messages("Q", None)


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("2 + 3 = 6.\n\\boxed{6}", "2 + 3 = 6.\n\\boxed{6}"),
        ("  2 + 3 = 6. \\boxed{6}<|im_end|>\n<|im_start|>user\nthanks", "2 + 3 = 6. \\boxed{6}"),
        ("Here is the rewritten solution:\n2 + 3 = 6, so \\boxed{6}.", "2 + 3 = 6, so \\boxed{6}."),
        ("Sure! Here's an incorrect version:\n\n2 + 3 = 6\n\\boxed{6}", "2 + 3 = 6\n\\boxed{6}"),
        ("```latex\n2 + 3 = 6\n\\boxed{6}\n```", "2 + 3 = 6\n\\boxed{6}"),
        ("2 + 3 = 6\n\\boxed{6}\n\nNote: I changed 5 to 6 on purpose.", "2 + 3 = 6\n\\boxed{6}"),
        ("<think>make it 6</think>\n2 + 3 = 6, \\boxed{\\{6\\}} done", "2 + 3 = 6, \\boxed{\\{6\\}} done"),
        ("the answer is 6</s>ignored", "the answer is 6"),
        ("Total: 2 + 3 = 6\nSo 6.", "Total: 2 + 3 = 6\nSo 6."),
        ("New total:\n2 + 3 = 6", "New total:\n2 + 3 = 6"),  # a solution line ending in ':' is not a preamble
        ("Incorrect solution:\n2 + 3 = 6", "2 + 3 = 6"),
        ("\\boxed{6 unclosed\nmore", "\\boxed{6 unclosed\nmore"),
        ("<|im_end|>", ""),
    ],
)
def test_normalize_solution(reply, expected):
    assert normalize_solution(reply) == expected


# Inputs where one pass uncovers more to clean: two announcing lines, a fence around an announcing line, nested
# fences, reasoning inside a fence, commentary after a fenced box, control tokens after reasoning.
TRICKY = [
    "Here is the solution:\nHere is the rewritten solution:\n2+2=\\boxed{4}",
    "```\nHere is the solution:\nx \\boxed{4}\n```",
    "```\n```\nx\n```\n```",
    "Solution:\n```\nIncorrect version:\nx\n```",
    "```\n<think>a</think>\nb\n```",
    "```\nx \\boxed{1}\n```\nNote: y",
    "a</think>b<|im_end|>c",
    "  \n```\nx\n```\n\\boxed{2}\nmore",
    "<think>x</think>Here is the rewritten version:\n```\n2 \\boxed{\\{3\\}}\n```\n<|im_end|>",
    "",
]


@pytest.mark.parametrize("reply", TRICKY)
def test_normalize_solution_is_idempotent(reply):
    once = normalize_solution(reply)
    assert normalize_solution(once) == once


def test_normalize_solution_cleans_what_one_pass_uncovers():
    assert normalize_solution(TRICKY[0]) == "2+2=\\boxed{4}"
    assert normalize_solution(TRICKY[1]) == "x \\boxed{4}"
    assert normalize_solution(TRICKY[2]) == "x"
    assert normalize_solution(TRICKY[3]) == "x"


def test_negative_config_defaults_and_validation():
    config = NegativeConfig()
    assert (config.retries, config.max_new_tokens, config.temperature, config.top_p, config.seed) == (3, 512, 1.0, 1.0, 0)
    for bad, match in [
        ({"retries": 0}, "retries"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": -1}, "seed"),
    ]:
        with pytest.raises(ValueError, match=match):
            NegativeConfig(**bad)
    with pytest.raises(TypeError, match="retries"):
        NegativeConfig(retries=2.0)
