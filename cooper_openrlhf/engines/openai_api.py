"""A generation engine over an OpenAI-compatible chat endpoint (`vllm serve`, SGLang, a hosted API).

The reward service's assistant: it rewrites verified-correct rollouts into wrong ones (`core.pair_builder`) without
holding a model of its own. One POST to `{base_url}/chat/completions` per prompt with `n` samples, sent
concurrently (a thread per request, at most `max_concurrency`), each with the request's seed. A connection error,
timeout or 5xx is retried `retries` times and then raises; a 4xx (the request itself is wrong: too many tokens for
the model, an unknown model name) raises at once with the server's message.
"""

from concurrent.futures import ThreadPoolExecutor

import requests

from cooper_openrlhf.engines.base import Prompt, SamplingConfig, is_chat


class OpenAIChatEngine:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 120.0,
                 retries: int = 3, max_concurrency: int = 16):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.timeout_s, self.retries, self.max_concurrency = model, timeout_s, retries, max_concurrency
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[str]:
        """len(prompts) * sampling.n replies, grouped by prompt (`engines.base.GenerationEngine`)."""
        messages = [p if is_chat(p) else [{"role": "user", "content": p}] for p in prompts]
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(messages)))) as pool:
            replies = pool.map(lambda im: self._one(im[1], sampling, sampling.seed + im[0]), enumerate(messages))
            return [text for reply in replies for text in reply]

    def _one(self, messages: list[dict], sampling: SamplingConfig, seed: int) -> list[str]:
        body = {"model": self.model, "messages": messages, "n": sampling.n, "max_tokens": sampling.max_new_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": seed}
        error = None
        for _ in range(self.retries + 1):
            try:
                response = requests.post(self.url, json=body, headers=self.headers, timeout=self.timeout_s)
                if 400 <= response.status_code < 500:
                    raise RuntimeError(f"assistant endpoint {self.url} refused the request: HTTP "
                                       f"{response.status_code}: {response.text[:500]}")
                response.raise_for_status()
                choices = sorted(response.json()["choices"], key=lambda c: c.get("index", 0))
                if len(choices) != sampling.n:
                    raise ValueError(f"asked for {sampling.n} choices, got {len(choices)}")
                return [choice["message"]["content"] or "" for choice in choices]
            except (requests.RequestException, KeyError, ValueError) as exc:
                error = exc
        raise RuntimeError(f"assistant endpoint {self.url} failed {self.retries + 1} times: {error}")
