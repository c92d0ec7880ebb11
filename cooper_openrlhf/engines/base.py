"""The generation-engine interface of the annotation generators and the LLM judge (`rm/annotate.py`,
`verify/judge.py`) and of Cooper's negative-rewriting assistant (`core/pair_builder.py`).

Implementations: `engines.hf.HFEngine` and `engines.vllm_offline.VLLMEngine` (built by name with
`engines.make_engine`), and `engines.openrlhf_vllm.OpenRLHFVLLMEngine` over OpenRLHF's running vLLM
actors (the assistant during RL).

An engine turns prompts into completions. A prompt is either a plain string (tokenised as is,
with the tokenizer's usual special tokens) or a chat conversation (a list of {"role", "content"}
dicts, rendered with the model's own chat template and a generation prompt; `prompt_token_ids`).
With `n` samples per prompt the result is flat and grouped by prompt: [p0 s0, p0 s1, ..., p1 s0,
...], length len(prompts) * n. How `seed` is applied is each engine's own (see its docstring).
"""

from dataclasses import dataclass
from typing import Protocol, Union, runtime_checkable

ChatMessages = list[dict[str, str]]
Prompt = Union[str, ChatMessages]


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample. temperature 0 means greedy decoding (then top_p and seed do not matter)."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.n < 1:
            raise ValueError(f"max_new_tokens and n must be >= 1, got {self.max_new_tokens} and {self.n}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}")


@runtime_checkable
class GenerationEngine(Protocol):
    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[str]:
        """Completions (text after the prompt, special tokens removed), len(prompts) * sampling.n of them."""
        ...


def is_chat(prompt: Prompt) -> bool:
    """True for a chat conversation, False for a plain string; raises on anything else."""
    if isinstance(prompt, str):
        return False
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        return True
    raise TypeError(f"a prompt must be a str or a list of {{'role', 'content'}} dicts, got {type(prompt).__name__}")


def prompt_token_ids(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of one prompt for a Hugging Face tokenizer.

    A chat is rendered by the model's chat template with a generation prompt; that text already
    holds the template's special tokens, so none are added again (no double BOS).
    """
    if is_chat(prompt):
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]
