"""RewardClient: POST samples to the reward service, retrying what a retry can fix, never inventing a reward.

Retried (with exponential backoff, `retries` times): connection errors, timeouts, and the statuses the service uses
for "try again" (500, 502, 503, 504). Not retried: 4xx, which say the request itself is wrong (401 wrong token, 400
malformed, 413 too big); they raise at once with the service's message. When retries run out it raises: a missing
reward must stop the trainer, not be counted as 0 (TRL #2737).

The token comes from `token`, else the environment variable `token_env` (COOPER_REWARD_TOKEN), and is sent as
`Authorization: Bearer`; it never appears in a URL or a log line.

`clients.async_http.AsyncRewardClient` is the same client for asyncio (aiohttp), built from this module's helpers.
"""

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import requests

from cooper_openrlhf.runtime.secrets import redact_url

RETRY_STATUSES = (500, 502, 503, 504)


class RewardServiceError(RuntimeError):
    """The service refused the request, or could not be reached within the retries."""


@dataclass
class Scores:
    rewards: list[float]
    extra_logs: dict[str, list[float]]


class ServiceEndpoint:
    """Where and how a client reaches the service: the URL, the token's header, the retry budget."""

    def __init__(self, url: str, token: str | None = None, token_env: str = "COOPER_REWARD_TOKEN",
                 retries: int = 5, timeout_s: float = 180.0, backoff_s: float = 0.5):
        self.url, self.retries, self.timeout_s, self.backoff_s = url, retries, timeout_s, backoff_s
        self.shown_url = redact_url(url)  # what errors name: a `?token=` in the URL stays out of logs
        self.headers = bearer_headers(token, token_env)


class RewardClient(ServiceEndpoint):
    def __init__(self, url: str, **endpoint):
        super().__init__(url, **endpoint)
        self.session = requests.Session()

    def score(self, queries: Sequence[str], prompts: Sequence[str], labels: Sequence[str]) -> Scores:
        """Rewards (one per query) and the service's per-sample extra logs."""
        body = request_body(queries, prompts, labels)
        problem = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(backoff(self.backoff_s, attempt))
            try:
                response = self.session.post(self.url, json=body, headers=self.headers, timeout=self.timeout_s)
            except (requests.ConnectionError, requests.Timeout) as exc:
                problem = redact_url(f"{type(exc).__name__}: {exc}")  # requests names the whole URL
                continue
            answer = read_answer(self.shown_url, response.status_code, response.text, len(queries))
            if isinstance(answer, Scores):
                return answer
            problem = answer
        raise out_of_retries(self.shown_url, self.retries, problem)


def bearer_headers(token: str | None, token_env: str) -> dict[str, str]:
    token = token or os.environ.get(token_env)
    return {"Authorization": f"Bearer {token}"} if token else {}


def request_body(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[str]) -> dict:
    return {"query": list(queries), "prompts": list(prompts), "labels": [str(label) for label in labels]}


def backoff(backoff_s: float, attempt: int) -> float:
    """Seconds to wait before retry `attempt` (1, 2, ...): doubling from `backoff_s`."""
    return backoff_s * 2 ** (attempt - 1)


def read_answer(shown_url: str, status: int, text: str, n_samples: int) -> Scores | str:
    """The service's answer as Scores (200), or what went wrong when a retry can fix it (RETRY_STATUSES); raises
    on any other status, and on a 200 without one reward per sample."""
    if status in RETRY_STATUSES:
        return f"HTTP {status}: {text[:300]}"
    if status != 200:
        raise RewardServiceError(f"{shown_url} refused the request: HTTP {status}: {text[:500]}")
    data = json.loads(text)
    rewards = data["rewards"]
    if len(rewards) != n_samples:
        raise RewardServiceError(f"{shown_url} returned {len(rewards)} rewards for {n_samples} samples")
    return Scores([float(r) for r in rewards], data.get("extra_logs") or {})


def out_of_retries(shown_url: str, retries: int, problem: str | None) -> RewardServiceError:
    return RewardServiceError(f"{shown_url} did not answer after {retries + 1} attempts ({problem})")
