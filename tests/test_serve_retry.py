"""Calls to an actor Ray restarts (`serve/replicated/retry.py`): a fresh call is sent again while the actor is gone,
within the request's time; any other error is the caller's at once. (The kills themselves run in
tests/test_serve_replicated.py.)"""

import asyncio
import itertools

import pytest
import ray

from cooper_openrlhf.serve.replicated.retry import backoff, until_answered


class _Actor:
    """Dead for its first `deaths` calls (as a killed actor is until Ray restarted it), then answers."""

    def __init__(self, deaths: int, error=ray.exceptions.RayActorError):
        self.deaths, self.error, self.calls = deaths, error, 0

    async def call(self):
        self.calls += 1
        if self.calls <= self.deaths:
            raise self.error()
        return "answer"


def test_a_call_is_sent_again_until_the_restarted_actor_answers():
    actor = _Actor(deaths=2)
    assert asyncio.run(until_answered(actor.call, "a test call", retry_for_s=10)) == "answer"
    assert actor.calls == 3  # a new call each time: an ObjectRef cannot be awaited again after it failed


def test_an_object_whose_owner_died_is_asked_for_again():
    actor = _Actor(deaths=1, error=lambda: ray.exceptions.OwnerDiedError("00" * 28, "", ""))
    assert asyncio.run(until_answered(actor.call, "a test call", retry_for_s=10)) == "answer"


def test_an_error_of_the_call_itself_is_not_retried():
    actor = _Actor(deaths=1, error=ValueError)
    with pytest.raises(ValueError):
        asyncio.run(until_answered(actor.call, "a test call", retry_for_s=10))
    assert actor.calls == 1


def test_past_the_requests_time_the_actors_death_is_raised():
    actor = _Actor(deaths=100)
    with pytest.raises(ray.exceptions.RayActorError):
        asyncio.run(until_answered(actor.call, "a test call", retry_for_s=0.25))
    assert actor.calls == 2  # waits of 0.1 s, then 0.2 s would pass the 0.25 s


def test_the_waits_double_to_two_seconds():
    assert list(itertools.islice(backoff(60.0), 7)) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
