"""A GenerationEngine over OpenRLHF's running vLLM Ray actors (`RolloutRayActor`).

OpenRLHF's `create_vllm_engines` starts one `RolloutRayActor` per engine; each serves an async
`generate(prompt_token_ids, sampling_params)` that returns a vLLM `RequestOutput`. This engine
lets Cooper's assistant be the policy itself, on the very engines that sampled the rollouts:

- prompts are rendered with the given Hugging Face tokenizer (`base.prompt_token_ids`, the
  model's chat template), so the engines receive token ids exactly as for rollouts;
- each of the len(prompts) * n samples is its own request with n=1 and seed `sampling.seed + i`
  (i = its flat index), so a call is reproducible whatever the batching and engine count;
- requests go round-robin over the engines, all submitted at once up to `max_in_flight`
  outstanding (a bounded window; the actors' async loops batch them inside vLLM), and are
  gathered back in input order.

Sleep mode is the caller's business: with `--vllm.enable_sleep` the engines must be awake
(`wake_up`) before `generate` and put back to sleep by the caller afterwards; this engine never
changes their state, so it can run inside the same awake window as the rollouts.

A prompt with no room left under `max_model_len` (when given) is not sent: vLLM would reject it
and fail the whole call. Its completion is "" and a warning names how many were skipped; longer
prompts that fit get `max_tokens` cut to the room left. Without `max_model_len` vLLM's own error
propagates.
"""

import logging

from cooper_openrlhf.engines.base import Prompt, SamplingConfig, prompt_token_ids

logger = logging.getLogger(__name__)


class OpenRLHFVLLMEngine:
    """GenerationEngine over `RolloutRayActor` handles.

    engines: handles from `openrlhf.trainer.ray.vllm_engine.create_vllm_engines` (or any actors with
        the same async `generate(prompt_token_ids, sampling_params)`).
    tokenizer: the served model's Hugging Face tokenizer.
    max_model_len: the engines' max_model_len, if known (see the module docstring).
    max_in_flight: most requests outstanding at once, over all engines.
    """

    def __init__(self, engines: list, tokenizer, max_model_len: int | None = None, max_in_flight: int = 256):
        if not engines:
            raise ValueError("OpenRLHFVLLMEngine needs at least one vLLM engine handle")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if max_model_len is not None and max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        self.engines = list(engines)
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.max_in_flight = max_in_flight

    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[str]:
        import ray
        from vllm import SamplingParams

        token_ids = [prompt_token_ids(self.tokenizer, prompt) for prompt in prompts]
        requests = []  # (flat index, token ids, max_tokens) in input order
        skipped = 0
        for p, ids in enumerate(token_ids):
            max_tokens = sampling.max_new_tokens
            if self.max_model_len is not None:
                max_tokens = min(max_tokens, self.max_model_len - len(ids))
            for s in range(sampling.n):
                if max_tokens < 1:
                    skipped += 1
                    continue
                requests.append((p * sampling.n + s, ids, max_tokens))
        if skipped:
            longest = max(len(ids) for ids in token_ids)
            logger.warning(
                "%d of %d requests not sent: their prompt (longest %d tokens) leaves no room under max_model_len=%d",
                skipped, len(prompts) * sampling.n, longest, self.max_model_len,
            )

        completions = [""] * (len(prompts) * sampling.n)
        in_flight: dict = {}  # ObjectRef -> flat index
        next_request = 0
        while next_request < len(requests) or in_flight:
            while next_request < len(requests) and len(in_flight) < self.max_in_flight:
                index, ids, max_tokens = requests[next_request]
                params = SamplingParams(
                    n=1,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    max_tokens=max_tokens,
                    seed=sampling.seed + index,
                )
                engine = self.engines[next_request % len(self.engines)]
                in_flight[engine.generate.remote(ids, params)] = index
                next_request += 1
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in done:
                completions[in_flight.pop(ref)] = self._text(ray.get(ref))
        return completions

    def _text(self, output) -> str:
        """The completion text of a one-sample RequestOutput (decoded here if vLLM did not detokenize)."""
        sample = output.outputs[0]
        if sample.text is not None:
            return sample.text
        return self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
