"""AsyncRewardClient: `clients.http.RewardClient` for asyncio, over aiohttp, with the same contract.

Retried (with exponential backoff, `retries` times): connection errors, timeouts, and 500, 502, 503, 504. Not
retried: any other 4xx, raised at once with the service's message. When retries run out it raises: never a made-up
reward. The token goes in `Authorization: Bearer`, never in a URL or a log line.

Each `score` opens its own aiohttp session: a session belongs to the event loop it was made in, and callers run
their loops differently (TRL keeps one loop in a daemon thread, a script may call `asyncio.run` per batch). One
request per call (a whole batch), so the extra connection costs nothing measurable.
"""

import asyncio
from collections.abc import Sequence

import aiohttp

from cooper_openrlhf.clients.http import Scores, ServiceEndpoint, backoff, out_of_retries, read_answer, request_body
from cooper_openrlhf.runtime.secrets import redact_url


class AsyncRewardClient(ServiceEndpoint):
    async def score(self, queries: Sequence[str], prompts: Sequence[str], labels: Sequence[str]) -> Scores:
        """Rewards (one per query) and the service's per-sample extra logs."""
        body = request_body(queries, prompts, labels)
        problem = None
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)  # each attempt's
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for attempt in range(self.retries + 1):
                if attempt:
                    await asyncio.sleep(backoff(self.backoff_s, attempt))
                try:
                    async with session.post(self.url, json=body, headers=self.headers) as response:
                        status, text = response.status, await response.text()
                except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                    problem = redact_url(f"{type(exc).__name__}: {exc}")
                    continue
                answer = read_answer(self.shown_url, status, text, len(queries))
                if isinstance(answer, Scores):
                    return answer
                problem = answer
        raise out_of_retries(self.shown_url, self.retries, problem)
