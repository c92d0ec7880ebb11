"""The replicated service's HTTP face: today's app (`serve/app.py`) around a service that lives in other processes.

Ray Serve's proxy hands each HTTP request to an ingress replica, which runs `serve.app.build_app` unchanged (auth,
body limits, parsing, text validation, prompt splitting, the memory bound, the statuses, the answer) around
`RemoteService`, which keeps the contract the app asks of a service (`serve/contract.py`):
  1. `score(samples)`: a place per sample from the group registry (its group's RM version; a new group waits there
     while an update is in flight; a sample identical to one already answered gets that answer back instead), the
     samples of concurrent requests gathered into one call to the scoring deployment (`serve/batcher.py`'s
     `MicroBatcher`, `--max-batch` / `--max-wait-ms`, a few calls in flight per replica; Serve routes each to a
     replica, whose `@serve.batch` merges the calls it gets), the reward of the service's mode (`core.pay`, as in
     one process), the scored samples recorded in their groups, and only then the answer; on any failure the places
     are given back, so the client's retry takes them again. One call per batch, not per sample: each Serve or
     actor call costs CPU in both processes and Ray's RPC, which on a small machine is the front's ceiling. So the
     registry's calls are gathered too: the places of the requests that arrive while one `reserve_many` call is in
     flight go in the next, and the same for `record_many` (registry.py: each request is placed on its own, and
     one that waits for an update is answered apart, so it holds up no other). A request's answer waits for its
     record: sent later, a retry of the sample could reach the registry before its record (and be scored and
     placed again), and an ingress that died in between would leave answered samples out of their groups.
  2. `gauges()`: the registry's numbers, with this ingress's own.

A replica that dies with calls in flight (kill -9, a lost node) fails them with `RayActorError` (Serve does not
retry them); Serve's router sends calls it had not yet routed elsewhere once the controller notices. So each call
that fails that way is sent again (`retry.py`: after 0.1 s doubling to 2 s, for up to `--request-timeout-s`; the app
answers the request 504 at that time, under OpenRLHF's 180 s): a replica restart costs the trainer time, never a
failed try. The registry's calls are sent again the same way while Ray restarts it. An error the scoring itself
raised is not retried here (it is that sample's 500, as in one process).
"""

import asyncio
import logging
import time

import ray

from cooper_openrlhf.core import REWARD_MODES
from cooper_openrlhf.serve.batcher import MicroBatcher
from cooper_openrlhf.serve.book import NO_GROUP, Place, Wanted
from cooper_openrlhf.serve.contract import Scored
from cooper_openrlhf.serve.groups import fingerprint
from cooper_openrlhf.serve.metrics import ServiceLog
from cooper_openrlhf.serve.protocol import Sample
from cooper_openrlhf.serve.replicated.registry import Waiting
from cooper_openrlhf.serve.replicated.retry import backoff, until_answered
from cooper_openrlhf.serve.replicated.scoring import ScoreItem
from cooper_openrlhf.serve.steps import answers, check_finite, paid_samples, rm_item

logger = logging.getLogger(__name__)

COUNT_FLUSH_S = 1.0  # how often an ingress that asks no places reports its sample counts to the registry
# Requests per registry call: a call's cost is mostly its own, not its size (a few KB per sample recorded)
REGISTRY_MAX_REQUESTS = 256


class RemoteService:
    """See the module docstring; the replicated host of `serve.contract.RewardHost`. `registry`: the group
    registry's actor handle; `scorer`: the scoring deployment's handle; `keeps_groups`: whether the service keeps
    groups (steps or learning): without, no place is asked for and the version is the one served at start (nothing
    publishes another)."""

    def __init__(self, config, registry, scorer, keeps_groups: bool, version: int | None, calls_in_flight: int = 2,
                 retry_for_s: float = 150.0):
        self.config, self.registry, self.scorer = config, registry, scorer
        self.keeps_groups, self.version = keeps_groups, version
        self.pay = REWARD_MODES[config.mode]
        self.log = ServiceLog(None)
        self.retry_for_s = retry_for_s
        # One lane per scoring call in flight; the app's Retry-After reads this batcher's rate.
        self.rm_batcher = MicroBatcher([self._score_remote] * calls_in_flight, config.max_batch, config.max_wait_s,
                                       "scoring calls")
        self.mode, self.learning_status, self.groups_status = config.mode, "ok", "ok"
        # One registry call in flight per kind; what arrives meanwhile is the next call (no window: under load the
        # call in flight is the wait).
        self.reservations = MicroBatcher([self._reserve_remote], REGISTRY_MAX_REQUESTS, 0.0, "registry reservations")
        self.records = MicroBatcher([self._record_remote], REGISTRY_MAX_REQUESTS, 0.0, "registry records")
        self.retried = 0  # scoring calls sent again after their replica died
        # This ingress replica as the holder of the places it reserves (registry.py: a dead one's are given back).
        context = ray.get_runtime_context()
        self.holder = (context.get_actor_id(), context.current_actor) if context.get_actor_id() else None
        self.holder_id = self.holder[0] if self.holder else None
        self._uncounted = [0, 0]  # samples, held-out samples scored and not yet reported (no places asked)
        self._flusher = None

    async def start(self) -> None:
        self.rm_batcher.start()
        self.reservations.start()
        self.records.start()
        if not self.keeps_groups:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_counts_forever())

    async def stop(self, save: bool = True) -> None:
        """The learner's checkpoint is the launcher's to take (`launch.py`), once, not each ingress replica's."""
        if self._flusher is not None:
            self._flusher.cancel()
        await self.rm_batcher.stop()
        await self.reservations.stop()
        await self.records.stop()
        await self._flush_counts()

    async def score(self, samples: list[Sample]) -> list[Scored]:
        heldout = [s.question in self.config.heldout for s in samples]
        if self.keeps_groups:
            wanted = [Wanted(s.prompt, s.reference, fingerprint(s), held) for s, held in zip(samples, heldout)]
            places, paying_rule = await self._reserve(wanted)
        else:
            places, paying_rule = [Place(NO_GROUP, self.version, held) for held in heldout], False
        todo = [i for i, place in enumerate(places) if place.known is None]  # the rest were answered before
        try:
            results = await self.rm_batcher.submit_many(
                [ScoreItem(*rm_item(places[i].version, samples[i])) for i in todo])
            logits = [logit for logit, _ in results]
            check_finite(todo, logits)
        except BaseException:
            if self.keeps_groups:  # not awaited: this request may be cancelled
                self.registry.release.remote([places[i] for i in todo], self.holder_id)
            raise
        scored = paid_samples(self.pay, [samples[i] for i in todo], logits, [outcome for _, outcome in results],
                              paying_rule)
        if self.keeps_groups and todo:
            # shielded: once scored, the record is sent even if this request is cancelled (a client gone, its
            # timeout), as the sample's retry must find it
            await asyncio.shield(self.records.submit(([places[i] for i in todo], scored)))
        elif not self.keeps_groups:
            self._uncounted[0] += len(samples)
            self._uncounted[1] += sum(heldout)
        return answers(places, todo, scored)

    def _score_remote(self, items: list[ScoreItem]) -> list:
        """A batch through the scoring deployment (blocking: a batcher lane's thread), sent again while the replica
        it reached has died; per item a result or that item's exception."""
        waits = backoff(self.retry_for_s)
        while True:
            try:
                return self.scorer.score_many.remote(items).result()
            except ray.exceptions.RayActorError as exc:
                delay = next(waits, None)
                if delay is None:
                    raise
                self.retried += 1
                logger.warning("a scoring replica died with %d samples in flight (%s); sending them again in %.1fs",
                               len(items), type(exc).__name__, delay)
                time.sleep(delay)

    async def _reserve(self, wanted: list[Wanted]) -> tuple[list[Place], bool]:
        """(a place per sample, whether the rule reward is paid), in this ingress's next `reserve_many` call, or
        collected apart when its places wait for an update in flight."""
        answer = await self.reservations.submit(wanted)
        if not isinstance(answer, Waiting):
            return answer

        async def collected():  # a registry Ray restarted meanwhile knows no ticket: reserve again there
            got = await self.registry.reservation.remote(answer.ticket)
            return got if got is not None else await self.registry.reserve.remote(wanted, self.holder)

        return await self._registry_call(collected, "reserving places")

    async def _reserve_remote(self, requests: list[list[Wanted]]) -> list:
        """The reservations of a batch of requests in one registry call: per request its answer, its exception or
        `Waiting`."""
        return await self._registry_call(lambda: self.registry.reserve_many.remote(requests, self.holder),
                                         "reserving places")

    async def _record_remote(self, requests: list[tuple[list[Place], list]]) -> list:
        """The scored samples of a batch of requests in one registry call: per request None or its exception."""
        return await self._registry_call(lambda: self.registry.record_many.remote(requests, self.holder_id),
                                         "recording scored samples")

    async def _registry_call(self, call, what: str):
        """The registry's answer to `call()`, sent again while Ray restarts the registry (`retry.py`)."""
        return await until_answered(call, what, self.retry_for_s)

    async def _flush_counts(self) -> None:
        samples, heldout = self._uncounted
        if samples or heldout:
            self._uncounted = [0, 0]
            await self._registry_call(lambda: self.registry.count.remote(samples, heldout), "counting samples")

    async def _flush_counts_forever(self) -> None:
        while True:
            await asyncio.sleep(COUNT_FLUSH_S)
            try:
                await self._flush_counts()
            except Exception:
                logger.exception("reporting sample counts to the registry failed")

    async def gauges(self) -> dict[str, float]:
        """The registry's numbers (after this ingress's counts), with the retries this ingress made."""
        await self._flush_counts()
        status = await self._registry_call(lambda: self.registry.status.remote(), "reading the registry's status")
        self.mode, self.learning_status, self.groups_status = status["mode"], status["learning"], status["groups"]
        if status["last_step"] is not None:  # the last step's metrics at /metrics, as in one process
            self.log.step(*status["last_step"])
        return {**status["gauges"], "scoring_retries": float(self.retried)}


def ingress_class(config, args, token: str | None, registry, keeps_groups: bool, version: int | None,
                  scorer_name: str, app_name: str):
    """The ingress deployment's class: `serve.app.build_app` around a `RemoteService`, built in each replica (the
    prompt splitter of the flags: `serve.build.build_splitter`)."""
    from ray import serve

    from cooper_openrlhf.serve.app import build_app
    from cooper_openrlhf.serve.build import build_splitter

    def build():
        from cooper_openrlhf.serve.replicated.registry import worker_logging

        worker_logging()
        scorer = serve.get_deployment_handle(scorer_name, app_name=app_name)
        service = RemoteService(config, registry, scorer, keeps_groups, version,
                                calls_in_flight=max(2, 2 * args.replicas), retry_for_s=args.request_timeout_s)
        app = build_app(service, build_splitter(args), token=token, max_body_bytes=args.max_body_bytes,
                        max_request_samples=args.max_request_samples, request_timeout_s=args.request_timeout_s,
                        max_queued_samples=args.max_queued_samples, max_queued_bytes=args.max_queued_bytes,
                        max_sample_chars=args.max_sample_chars)
        # Serve's replica registers its handlers for its own errors on the app as on a Starlette app. /get_reward is
        # plain ASGI and answers every error itself; the routes that are FastAPI's (/metrics, /health) get them.
        app.add_exception_handler = app.fastapi.add_exception_handler
        return app

    @serve.ingress(build)
    class Ingress:
        def __init__(self, scorer):  # the scoring deployment, bound here so that it is deployed with the app
            self.scorer = scorer

    return Ingress
