"""What the reward service reads of the prompts real datasets make: a system prompt, several turns, and a prompt
OpenRLHF cut to its max length, with the real Qwen2 and SmolLM2 chat templates (docs/serve.md, "What the RM reads
of a prompt"). The truncated case goes through OpenRLHF's own `SingleTurnAgentExecutor.execute` (its truncation and
its decode), with only the vLLM engine replaced by a stand-in that returns fixed response tokens."""

import asyncio
import textwrap

import pytest

from cooper_openrlhf.serve.protocol import PromptSplitter, RequestError

TEMPLATES = ["tiny-qwen2-policy", "smollm2-135m-instruct"]
QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"
RESPONSE = "He has 3 + 4 = 7 apples. The answer is 7."


def _tokenizer(model_dir, name):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir(name))


def _query(tokenizer, prompt: str) -> str:
    """OpenRLHF's query for an uncut prompt: decode(prompt ids + response ids + eos), special tokens kept."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] + tokenizer(RESPONSE, add_special_tokens=False)[
        "input_ids"] + [tokenizer.eos_token_id]
    return tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("conversation", [
    [{"role": "system", "content": "You are a careful math tutor. Think step by step."},
     {"role": "user", "content": QUESTION}],
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": QUESTION}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! Ask me a math question."}, {"role": "user", "content": QUESTION}],
], ids=["system-prompt", "two-turns", "system-and-two-turns"])
def test_the_rm_reads_the_last_user_message_of_a_chat_prompt(model_dir, name, conversation):
    tokenizer = _tokenizer(model_dir, name)
    splitter = PromptSplitter.from_tokenizer(tokenizer)
    prompt = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    sample = splitter.split(_query(tokenizer, prompt), prompt, "7")
    assert sample.question == QUESTION
    assert sample.completion.strip() == RESPONSE


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_prompt_without_the_chat_template_is_refused_naming_the_flag(model_dir, name):
    splitter = PromptSplitter.from_tokenizer(_tokenizer(model_dir, name))
    with pytest.raises(RequestError, match="--no-chat-template"):
        splitter.question_of("Question: " + QUESTION)


class _StandInEngine:
    """The vLLM engine's `generate` as OpenRLHF's executor awaits it: fixed response tokens, finished by eos."""

    def __init__(self, response_ids: list[int]):
        self.response_ids = response_ids
        self.seen_prompt_ids: list[int] | None = None

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        from types import SimpleNamespace

        self.seen_prompt_ids = list(prompt_token_ids)
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=self.response_ids, finish_reason="stop",
                                                        logprobs=None)])


def _openrlhf_request(tokenizer, prompt: str, max_len: int, tmp_path) -> tuple[str, str, int]:
    """(query, prompt, prompt tokens kept) as OpenRLHF's SingleTurnAgentExecutor hands them to a remote reward:
    its reward-function route (`--reward.remote_url file.py`) builds the same strings as its HTTP route."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor
    from vllm import SamplingParams

    capture = tmp_path / "reward_func.py"
    capture.write_text(textwrap.dedent("""
        CALLS = []
        def reward_func(queries, prompts, labels):
            CALLS.append((queries[0], prompts[0]))
            return {"rewards": [0.0], "scores": [0.0], "extra_logs": {}}
    """))
    executor = SingleTurnAgentExecutor(str(capture))
    response_ids = tokenizer(RESPONSE, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    engine = _StandInEngine(response_ids)
    params = SamplingParams(max_tokens=len(response_ids))
    asyncio.run(executor.execute(prompt, "7", params, max_len, tokenizer, engine))
    (query, sent_prompt), = executor.reward_func.__globals__["CALLS"]
    return query, sent_prompt, len(engine.seen_prompt_ids)


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("question", [
    " ".join(f"Step {i}: add {i} apples to the basket." for i in range(60)) + " " + QUESTION,
    "Ünïcödé façade — naïve café, 東京 and Zürich. " * 30 + QUESTION,
], ids=["ascii", "multibyte"])
def test_a_prompt_openrlhf_cut_to_its_max_length_is_scored_from_its_response(model_dir, name, question, tmp_path):
    tokenizer = _tokenizer(model_dir, name)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                           add_generation_prompt=True)
    prompt_tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    query, sent_prompt, kept = _openrlhf_request(tokenizer, prompt, max_len=prompt_tokens // 2, tmp_path=tmp_path)
    assert sent_prompt == prompt and kept < prompt_tokens and not query.startswith(prompt)  # OpenRLHF cut it

    sample = PromptSplitter.from_tokenizer(tokenizer).split(query, sent_prompt, "7")
    assert sample.question == question  # the prompt field is whole: the question comes from it
    assert sample.completion.strip() == RESPONSE


def test_a_query_that_shares_no_tail_with_its_prompt_is_refused(model_dir):
    tokenizer = _tokenizer(model_dir, "tiny-qwen2-policy")
    splitter = PromptSplitter.from_tokenizer(tokenizer)
    prompt = splitter.render(QUESTION)
    with pytest.raises(RequestError, match="does not start with its prompt"):
        splitter.split("an unrelated text of some length" + RESPONSE, prompt, "7")


def test_the_question_of_a_prompt_is_worked_out_once(model_dir):
    splitter = PromptSplitter.from_tokenizer(_tokenizer(model_dir, "tiny-qwen2-policy"))
    prompt = splitter.render(QUESTION)
    calls = []
    recover = splitter._recover_question
    splitter._recover_question = lambda p: calls.append(p) or recover(p)
    for _ in range(8):
        assert splitter.question_of(prompt) == QUESTION
    assert calls == [prompt]
