"""What the HTTP app (`serve/app.py`) asks of the service that hosts it, written down once.

Two hosts keep it: the one-process `serve.service.RewardService`, and the replicated service's `RemoteService`
(`serve/replicated/ingress.py`), whose groups, scoring and learning live in other processes. A new transport (gRPC,
a queue) would be a third: it calls the same methods, and a new host answers the same ones.

- `score(samples)`: one request's rewards, in order (`Scored`); raises when any sample cannot be scored (the app
  answers 5xx and the client retries; `NonFiniteScore` for an RM logit that is NaN or infinite), never pays 0.
- `gauges()`: the point-in-time numbers of /metrics and /health; awaited, since a host in other processes asks for
  them. It also refreshes `mode`, `learning_status` and `groups_status`, which /health reads after it.
- `start()` / `stop(save)`: the app's lifespan; `stop` finishes the update in flight and, with `save`, checkpoints.
- `log`: the `serve.metrics.ServiceLog` the app counts requests in and renders /metrics with.
- `rm_batcher`: the `serve.batcher.MicroBatcher` whose rate (`stats`) sizes a refused request's Retry-After.
"""

from dataclasses import dataclass
from typing import Protocol

from cooper_openrlhf.serve.protocol import Sample
from cooper_openrlhf.verify.rule import Verdict


class NonFiniteScore(RuntimeError):
    """The RM's logit of a sample is NaN or infinite: no reward to pay and nothing to learn from."""


@dataclass
class Scored:
    """What the service answers for one sample."""

    reward: float
    logit: float
    verdict: Verdict
    version: int


class RewardHost(Protocol):
    """See the module docstring."""

    log: object  # serve.metrics.ServiceLog
    rm_batcher: object  # serve.batcher.MicroBatcher

    @property
    def mode(self) -> str:
        """The reward mode being paid ("rule" once a hacking alarm switched to it)."""

    @property
    def learning_status(self) -> str:
        """/health's "learning": "ok" or "failing: <why>"."""

    @property
    def groups_status(self) -> str:
        """/health's "groups": "ok" or "warning: <cause and fix>"."""

    async def start(self) -> None: ...

    async def stop(self, save: bool = True) -> None: ...

    async def score(self, samples: list[Sample]) -> list[Scored]: ...

    async def gauges(self) -> dict[str, float]: ...
