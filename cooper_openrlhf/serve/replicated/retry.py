"""Calls to an actor that Ray restarts when it dies: sent again until it answers, within the request's own time.

A call in flight when its actor dies fails with `RayActorError` (Ray does not retry it: the service's calls are
not all safe to run twice), and so does an object whose owner died (`OwnerDiedError`: a version's weights owned by
the registry that died). Calls sent while Ray restarts the actor wait for it. So the caller sends the call again,
after 0.1 s doubling to 2 s, until it answers or `retry_for_s` has passed (then the error is raised: the app
answers 504 or 500 and OpenRLHF's client tries again): a restart costs the trainer time, never a failed try.
"""

import asyncio
import logging
import time

import ray

logger = logging.getLogger(__name__)

RETRY_FIRST_S, RETRY_MAX_S = 0.1, 2.0
ACTOR_GONE = (ray.exceptions.RayActorError, ray.exceptions.OwnerDiedError)


def backoff(retry_for_s: float):
    """The waits before each resend: 0.1 s doubling to 2 s, while they end within `retry_for_s` from now."""
    delay, deadline = RETRY_FIRST_S, time.monotonic() + retry_for_s
    while time.monotonic() + delay <= deadline:
        yield delay
        delay = min(2 * delay, RETRY_MAX_S)


async def until_answered(call, what: str, retry_for_s: float):
    """`await call()` (a fresh call each time: an ObjectRef cannot be sent again), resent while its actor is gone."""
    waits = backoff(retry_for_s)
    while True:
        try:
            return await call()
        except ACTOR_GONE as exc:
            delay = next(waits, None)
            if delay is None:
                raise
            logger.warning("%s: the actor died (%s); sending it again in %.1fs", what, type(exc).__name__, delay)
            await asyncio.sleep(delay)
