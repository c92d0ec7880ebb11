"""A TRL reward function (`GRPOTrainer(reward_funcs=[...])`) that pays the reward service's reward.

    from cooper_openrlhf.clients.trl import service_reward          # or async_service_reward
    trainer = GRPOTrainer(model=..., reward_funcs=[service_reward("http://127.0.0.1:5000/get_reward")], ...)

TRL calls it with the batch's `prompts` and `completions` (strings, or chat messages for a conversational
dataset) and every dataset column as a keyword; the reference answer is the column `label_key` ("answer"). The
question sent is the prompt's last user message (or the prompt string), so the service runs with
`--no-chat-template`; TRL's n generations of a prompt arrive together and form the service's GRPO group.

`async_service_reward` is the `async def` form (aiohttp): TRL (>= 1.x) sees a coroutine function and awaits it on
its own event loop thread, gathered with its other async reward functions, so a slow service overlaps with them
instead of blocking one after another.
"""

from cooper_openrlhf.clients.async_http import AsyncRewardClient
from cooper_openrlhf.clients.http import RewardClient


def _text(item) -> str:
    if isinstance(item, str):
        return item
    users = [m["content"] for m in item if m.get("role") == "user"]
    return users[-1] if users else item[-1]["content"]


def _samples(prompts, completions, columns: dict, label_key: str) -> tuple[list[str], list[str], list]:
    """(queries, questions, labels) as the service takes them: query = question + completion."""
    if label_key not in columns:
        raise KeyError(f"the dataset has no column {label_key!r} (the reference answer); columns: "
                       f"{sorted(columns)}; pass label_key=")
    questions = [_text(p) for p in prompts]
    answers = [_text(c) for c in completions]
    return [q + a for q, a in zip(questions, answers)], questions, columns[label_key]


def service_reward(url: str, label_key: str = "answer", **client_kwargs):
    """The reward function; `client_kwargs` go to `clients.http.RewardClient` (token, retries, timeout_s)."""
    client = RewardClient(url, **client_kwargs)

    def cooper_service_reward(prompts, completions, **columns) -> list[float]:
        return client.score(*_samples(prompts, completions, columns, label_key)).rewards

    return cooper_service_reward


def async_service_reward(url: str, label_key: str = "answer", **client_kwargs):
    """The `async def` reward function; `client_kwargs` go to `clients.async_http.AsyncRewardClient` (token,
    retries, timeout_s, backoff_s), which retries and raises exactly as `RewardClient` does."""
    client = AsyncRewardClient(url, **client_kwargs)

    async def cooper_service_reward(prompts, completions, **columns) -> list[float]:
        return (await client.score(*_samples(prompts, completions, columns, label_key))).rewards

    return cooper_service_reward
