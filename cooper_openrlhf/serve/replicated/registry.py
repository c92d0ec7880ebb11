"""One group registry for every replica: which RM version scores a sample, and when a step is complete.

GRPO compares the n samples of a prompt with each other, so all n must be scored by one RM version; OpenRLHF's
engines send them as n separate requests that Serve spreads over the scoring replicas. The pinning therefore lives
in one place that every ingress replica asks, this actor, with the one-process service's own code: `serve/book.py`
(reserve a place, which fixes the version; record or release it; recorded answers for retries; the wait-for-update
gate: the first sample of a new group waits while an update is in flight) over `serve/groups.py`'s `GroupTracker`,
and the steps and trainer-group warnings of `serve/step_supervisor.py`.

Why an actor of its own and not the ingress or the learner: the ingress may run several replicas and is
restarted by Serve like any replica, and the learner is down for tens of seconds when it restarts (DeepSpeed,
the checkpoint), while the groups must stay one and must go on being pinned and recorded meanwhile. The registry
holds no model and does only bookkeeping on its event loop, so it is the part least likely to die.

If it dies all the same, Ray starts it again (`max_restarts=-1`) and it starts itself on its first call
(`_ready`, which every call awaits): the RM version and the counters the learner holds, the weights from the
learner, the sample counts of the learner's last checkpoint. The groups open at its death are lost: their samples
were answered and paid, but they are not learned from. Group ids carry the tracker's incarnation, so a place
reserved before the restart never names a group of the new one: its record is placed again by its (prompt,
label) at the version that scored it when that key's group here is at that version or it can open one there, and
is otherwise counted and dropped from learning (`samples_unplaced`); its release is ignored. The ingress and the
scoring replicas send their calls again until it answers (`retry.py`), so the trainer sees a pause of a few
seconds, not a failed try; `registry_restarts` counts it.

Per request the ingress asks twice (a place per sample, then `record` or `release`; a sample identical to one
already answered gets that answer with its place and is not scored); a service that keeps no groups (no steps, no
learning) never asks, its version never changes. Each ingress gathers the asks of its concurrent requests into one
call (`reserve_many`, `record_many`): a call costs CPU in both processes whatever it carries. Each request in a
call is placed on its own, as if sent alone (Ray runs an async actor's calls side by side): one whose new group
waits for an update in flight does not hold up the others of its call, whose answers go back at once, while its
own is a `Waiting` ticket the ingress collects (`reservation`). Each place is noted with the ingress replica that
holds it (`holders.py`), so that an ingress that dies between the two calls does not strand its places: a retry
that finds its prompt's groups full but not all scored first gives back the places of holders that are dead (so
does the retry of a sample identical to a recorded one, the policy's twin: its place may be the dead holder's).

Steps: when `groups_per_update` groups are complete the registry hands them to the learner actor
(`learner_actor.py`), which trains, publishes and checkpoints. A new version comes back as an object owned by this
actor (the second return of the learner's call), so it outlives a learner that dies, and the scoring replicas
fetch it by reference (`weights_of`). If the learner dies during a step, scoring goes on with the last published
version (the gate is opened), and once the learner is back from its checkpoint the step is sent again, unless
that checkpoint already holds it; a step that kills the learner `MAX_STEP_KILLS` times is dropped (counted, and
/health says so): whatever in it kills the learner would kill it forever.
"""

import asyncio
import logging
import uuid
from dataclasses import dataclass

import ray

from cooper_openrlhf.serve.book import NO_GROUP, GroupBook, Place, Wanted  # noqa: F401 (the callers' names)
from cooper_openrlhf.serve.groups import GroupTracker
from cooper_openrlhf.serve.published_names import FAILED_STEP, STEP_FAILURES, STEPS_COUNTER, STEPS_DROPPED
from cooper_openrlhf.serve.replicated.holders import PlaceHolders
from cooper_openrlhf.serve.step_supervisor import group_gauges

logger = logging.getLogger(__name__)

MAX_STEP_KILLS = 3  # a step that killed the learner this often is dropped
LIVENESS_TIMEOUT_S = 5.0  # a holder that does not answer a ping within this is taken as alive (its places stay)
LEARNER_COUNTERS = (STEPS_COUNTER, "updates", "pairs", "alarms")
# A waiting reservation's answer is kept this long for its ingress to collect: far past any request's time (a
# dead ingress never collects it; its places are given back as any dead holder's)
WAITING_KEPT_S = 900.0


@dataclass(frozen=True)
class Waiting:
    """`reserve_many`'s answer for a request whose places wait (an update in flight): collect it by `ticket`."""

    ticket: str  # unique across the registry's incarnations: a restarted one never answers another's ticket


def worker_logging() -> None:
    """This package's log lines in a Ray worker's log (workers leave the root logger at WARNING, no handler)."""
    package = logging.getLogger("cooper_openrlhf")
    package.setLevel(logging.INFO)
    if not package.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        package.addHandler(handler)


class GroupRegistry(GroupBook):
    """See the module docstring. `config`: the service's `ServiceConfig`; `learner`: the learner actor's handle,
    or None for a service without steps (then no group is kept)."""

    def __init__(self, config, learner=None):
        worker_logging()
        self.config, self.learner = config, learner
        self.keeps_groups = learner is not None
        self.groups = GroupTracker(config.group_size, config.group_timeout_s, silence_s=config.stale_after_s,
                                   remembered=config.retry_record)
        self.ready = []  # complete groups not yet in a step
        self.version = 0
        self.weights: dict[int, ray.ObjectRef] = {}  # version -> its weights (a state dict) in the object store
        self.counters = {"samples": 0, "heldout_samples": 0}
        self.learner_counters = dict.fromkeys(LEARNER_COUNTERS, 0)
        self.rm_health: dict[str, float] = {}  # the learner's RM guard gauges (`core.RMGuard.gauges`)
        self.paying_rule = False
        self.step_failures = 0
        self.step_error: str | None = None
        self.groups_repinned = 0
        self.holders = PlaceHolders()
        self.places_given_back = 0  # places of ingress replicas found dead, given back for their samples' retries
        self.samples_unplaced = 0  # samples placed by an earlier incarnation that could not be placed again
        self.steps_dropped = 0  # steps that killed the learner MAX_STEP_KILLS times
        self.last_step: tuple[int, dict] | None = None  # (index, metrics) of the last step the learner ran
        self.learner_restarts = 0
        self.learner_down = False
        self._waited = 0.0
        self._waiting: dict[str, asyncio.Task] = {}  # ticket -> a reservation that waits (`reserve_many`)
        self.registry_calls = 0  # calls from the ingress replicas that place or record samples
        self._closing = False
        self._steps = None
        # Every call that reads the groups or the version waits for the start (`_ready`), which hears from the
        # learner first (its DeepSpeed start-up runs while Serve deploys the replicas).
        self._starting: asyncio.Future | None = None
        # (outside Ray, as the unit tests build it, asking would start a Ray cluster)
        self.reconstructed = ray.is_initialized() and ray.get_runtime_context().was_current_actor_reconstructed
        self.registry_restarts = 0
        self.update_done = asyncio.Event()
        self.update_done.set()
        self._step_wakeup = asyncio.Event()
        self._init_group_checks()

    async def start(self) -> int:
        """Resume from the learner's checkpoint (when it loaded one) and start the steps; the version served."""
        await self._ready()
        return self.version

    async def _ready(self) -> None:
        """Started once, by the launcher's `start` or, after Ray restarted this actor, by whichever call comes first."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        try:
            await asyncio.shield(self._starting)
        except Exception:
            if self._starting.done():  # the next call starts again (the learner may have been restarting too)
                self._starting = None
            raise

    async def _start(self) -> None:
        if self.reconstructed:
            logger.warning("the group registry was restarted: the groups open at its death are not learned from")
        if self.learner is not None:
            status = await self.learner.status.remote()
            self._adopt(status)
            self.version = status["version"]
            if status["state"]:
                if self.reconstructed:  # the groups of the last checkpoint are long gone; its sample counts stay
                    self.counters.update({k: status["state"]["counters"].get(k, 0) for k in self.counters})
                else:
                    self._load_state(status["state"], set(status["versions"]))
            if self.reconstructed:
                self.registry_restarts = await self.learner.registry_restarted.remote()
            for version in status["versions"]:  # the weights replicas may need: the latest and the pinned ones
                self.weights.setdefault(version, self.learner.weights.remote(version))
            self._steps = asyncio.get_running_loop().create_task(self._step_loop())
        elif self.reconstructed:  # no learner outlives it to count them: "restarted at least once"
            self.registry_restarts = 1

    # ------------------------------------------------------------------------------------ places
    async def reserve(self, wanted: list[Wanted],
                      holder: tuple[str, object] | None = None) -> tuple[list[Place], bool]:
        """(a place per sample, whether the rule reward is paid). `holder`: the calling ingress replica's (actor id,
        handle)."""
        self.registry_calls += 1
        return await self._reserve_request(wanted, holder)

    async def _reserve_request(self, wanted: list[Wanted], holder) -> tuple[list[Place], bool]:
        await self._ready()
        if self._closing:
            raise RuntimeError("the service is shutting down")
        places = await self._reserve_places(wanted, holder)
        self.counters["samples"] += sum(place.known is not None for place in places)  # the ingress records the rest
        return places, self.paying_rule

    async def reserve_many(self, requests: list[list[Wanted]], holder: tuple[str, object] | None = None) -> list:
        """`reserve` for each of the requests an ingress gathered, each on its own (module docstring): per request
        its answer, the exception it failed with, or `Waiting` when its places wait for an update in flight."""
        await self._ready()
        self.registry_calls += 1
        tasks = [asyncio.ensure_future(self._reserve_request(wanted, holder)) for wanted in requests]
        # Each task runs its first step before this one resumes: a request with nothing to wait for (no new group
        # during an update, no dead holder to ping) is placed within it, without a pause, so is done here.
        await asyncio.sleep(0)
        return [self._answer_or_ticket(task) for task in tasks]

    def _answer_or_ticket(self, task: asyncio.Task):
        if task.done():
            return task.exception() or task.result()
        ticket = uuid.uuid4().hex
        self._waiting[ticket] = task
        loop = asyncio.get_running_loop()
        task.add_done_callback(lambda done: done.cancelled() or done.exception())  # collected or not, it is read
        task.add_done_callback(lambda _: loop.call_later(WAITING_KEPT_S, self._waiting.pop, ticket, None))
        return Waiting(ticket)

    async def reservation(self, ticket: str) -> tuple[list[Place], bool] | None:
        """The answer of a reservation `reserve_many` left waiting; None for a ticket this incarnation never gave
        (Ray restarted the registry since: the ingress reserves again)."""
        self.registry_calls += 1
        task = self._waiting.pop(ticket, None)
        return None if task is None else await task

    def _took_place(self, holder, group_id: str) -> None:
        self.holders.take(holder, group_id)

    def _gave_back(self, holder_id, group_id: str) -> None:
        self.holders.give_back(holder_id, group_id)

    async def _before_new_place(self, want: Wanted) -> None:
        await self._give_back_places_of_dead_holders(want)

    async def _before_repeat(self, want: Wanted) -> None:
        # The policy's twin of a recorded sample, retried after the replica scoring it died: its place in the full
        # group is the dead replica's, given back here so the twin counts in its group instead of as a retry (the
        # group would otherwise wait forever for a sample that was answered).
        await self._give_back_places_of_dead_holders(want)

    async def _give_back_places_of_dead_holders(self, want: Wanted) -> None:
        """Before a sample opens a new group: if its key's groups are full but not all scored, the places there of
        holders that are dead are given back (module docstring), so the sample takes one."""
        if self.groups.has_filling_group(want.prompt, want.label):
            return
        stuck = {group.id for group in self.groups.full_unscored(want.prompt, want.label)}
        for holder_id in self.holders.holding(stuck):
            if await self._alive(holder_id):
                continue
            for group_id, count in self.holders.drop(holder_id).items():
                group = self.groups.open.get(group_id)
                for _ in range(count if group is not None else 0):
                    self.groups.release(group)
                    self.places_given_back += 1
            logger.warning("an ingress replica died holding places of open groups; given back for the retries of "
                           "their samples (%d given back so far)", self.places_given_back)

    async def _alive(self, holder_id: str) -> bool:
        handle = self.holders.handles.get(holder_id)
        try:
            # every actor answers __ray_ready__; a dead one fails at once with RayActorError
            await asyncio.wait_for(handle.__ray_ready__.remote(), LIVENESS_TIMEOUT_S)
            return True
        except ray.exceptions.RayActorError:
            return False
        except asyncio.TimeoutError:
            return True

    async def release(self, places: list[Place], holder_id: str | None = None) -> None:
        """Give back the places of samples that were not scored (their retries reserve again)."""
        await self._ready()
        self.registry_calls += 1
        self._release_places(places, holder_id)

    async def record(self, places: list[Place], scored: list, holder_id: str | None = None) -> None:
        """The scored samples (`serve.groups.ScoredSample`) into their groups; a group that completes joins the
        next step. A place of an earlier incarnation is placed again (module docstring)."""
        await self._ready()
        self.registry_calls += 1
        self._record_request(places, scored, holder_id)

    def _record_request(self, places: list[Place], scored: list, holder_id: str | None) -> None:
        self._record_places(places, scored, holder_id)
        self.counters["samples"] += len(places)
        if self.keeps_groups:
            self._step_wakeup.set()

    async def record_many(self, requests: list[tuple[list[Place], list]], holder_id: str | None = None) -> list:
        """`record` for each (places, scored samples) of the requests an ingress gathered: per request None, or the
        exception it failed with."""
        await self._ready()
        self.registry_calls += 1
        outcomes = []
        for places, scored in requests:
            try:
                self._record_request(places, scored, holder_id)
                outcomes.append(None)
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    def _holds_version(self, version: int) -> bool:
        return version in self.weights

    def count(self, samples: int, heldout: int) -> None:
        """Samples an ingress scored without asking for places (a service that keeps no groups)."""
        self.counters["samples"] += samples
        self.counters["heldout_samples"] += heldout

    async def weights_of(self, version: int) -> tuple[list, list[int]]:
        """([the object holding `version`'s weights, or None]: in a list, so the caller gets the reference), and the
        versions a replica must keep (the latest and those open groups are pinned to)."""
        await self._ready()
        return [self.weights.get(version)], sorted(self._versions_in_use() | {self.version})

    # ------------------------------------------------------------------------------------ steps
    def _retire_versions(self, in_use: set[int]) -> None:
        keep = in_use | {self.version}
        for version in [v for v in self.weights if v not in keep]:
            del self.weights[version]

    def _versions_in_use(self) -> set[int]:
        return self.groups.versions_in_use()

    def _steps_done(self) -> int:
        return self.learner_counters[STEPS_COUNTER]

    async def _run_step(self, index: int, groups: list) -> None:
        """One step in the learner; a new version is adopted when the learner returns it (after its checkpoint).
        A learner that dies meanwhile is waited for and sent the step again, up to MAX_STEP_KILLS deaths (module
        docstring)."""
        waited, self._waited = self._waited, 0.0
        self.update_done.clear()
        kills = 0
        try:
            while True:
                result_ref, weights_ref = self.learner.run_step.options(num_returns=2).remote(
                    index, groups, self.version, self._pinned_refs(), waited, ray.get_runtime_context().current_actor)
                try:
                    result = await result_ref
                    break
                except ray.exceptions.RayActorError as exc:
                    kills += 1
                    logger.warning("the learner died during step %d (%s; %d of %d); scoring goes on with RM version "
                                   "%d while it restarts from its checkpoint", index, type(exc).__name__, kills,
                                   MAX_STEP_KILLS, self.version)
                    self.learner_restarts += 1
                    self.learner_down = True
                    self.update_done.set()  # new groups take the last published version meanwhile
                    status = await self._learner_back()
                    self.learner_down = False
                    if status["counters"][STEPS_COUNTER] > index:  # its checkpoint holds this step already
                        self._adopt(status)
                        if status["version"] > self.version:
                            self._take_version(status["version"], self.learner.weights.remote(status["version"]))
                        return
                    self._adopt(status)
                    if kills >= MAX_STEP_KILLS:
                        self.groups.drop(groups, "learner crash")
                        self.steps_dropped += 1
                        failed = FAILED_STEP.format(index=index)
                        raise RuntimeError(f"{failed} killed the learner {kills} times; its {len(groups)} groups are "
                                           f"dropped from learning (the next step tries again)")
                    self.update_done.clear()
        finally:
            self.update_done.set()
        self._adopt(result)
        self.last_step = (index, result.get("step_metrics", {}))
        if result["version"] > self.version:
            self._take_version(result["version"], weights_ref)
        if result["error"]:
            raise RuntimeError(result["error"])

    def _take_version(self, version: int, ref) -> None:
        self.weights[version] = ref
        self.version = version

    def _adopt(self, status: dict) -> None:
        self.learner_counters = {k: status["counters"].get(k, 0) for k in LEARNER_COUNTERS}
        self.paying_rule = status["paying_rule"]
        self.rm_health = status.get("rm_health", {})

    def _pinned_refs(self) -> dict:
        """{version: weights} of the versions open groups are pinned to, for the learner's checkpoint (a dict, so
        Ray passes the references, not the weights)."""
        return {v: self.weights[v] for v in self._versions_in_use() if v in self.weights}

    async def _learner_back(self) -> dict:
        """The restarted learner's status (it restarts as often as it dies: `max_restarts=-1`)."""
        while True:
            try:
                return await self.learner.status.remote()
            except ray.exceptions.RayActorError:
                await asyncio.sleep(1.0)

    # --------------------------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict:
        """The groups and counters a checkpoint keeps (`RewardService.state()` less what the learner adds)."""
        return {"counters": dict(self.counters), **self._group_state()}

    def _load_state(self, state: dict, held: set[int]) -> None:
        """Groups keep their versions where the checkpoint holds them (`serve/book.py`)."""
        self.counters.update({k: state.get("counters", {}).get(k, 0) for k in self.counters})
        self._load_groups(state, held)

    async def shutdown(self) -> str | None:
        """Finish the step in flight, then the learner's last checkpoint and export (its path, or None)."""
        self._closing = True
        await self.update_done.wait()
        if self._steps is not None:
            self._steps.cancel()
        if self.learner is None:
            return None
        return await self.learner.finish.remote(self._pinned_refs(), ray.get_runtime_context().current_actor)

    # ------------------------------------------------------------------------------------ status
    async def status(self) -> dict:
        """What /health and /metrics show (`RewardService.gauges()`, `learning_status`, `groups_status`)."""
        await self._ready()
        learning = self.learning_status
        if self.learner_down:
            learning = "learner restarting: scoring with the last published version"
        gauges = {"rm_version": self.version, "open_groups": len(self.groups.open), "ready_groups": len(self.ready),
                  "groups_completed": self.groups.completed, "update_in_flight": not self.update_done.is_set(),
                  "paying_rule": self.paying_rule, STEP_FAILURES: self.step_failures,
                  "learning_failing": learning.startswith("failing"), "groups_repinned": self.groups_repinned,
                  "learner_restarts": self.learner_restarts, "places_given_back": self.places_given_back,
                  "registry_restarts": self.registry_restarts, "samples_unplaced": self.samples_unplaced,
                  "registry_calls": self.registry_calls,
                  STEPS_DROPPED: self.steps_dropped, **group_gauges(self.groups, self.group_warnings),
                  **self.rm_health, **self.counters, **self.learner_counters}
        return {"gauges": {k: float(v) for k, v in gauges.items()}, "learning": learning, "last_step": self.last_step,
                "groups": self.groups_status, "mode": "rule" if self.paying_rule else self.config.mode}
