"""The one learner of a replicated service: the steps, the RM update, the hacking monitor, the checkpoints.

What `serve/service.py`'s `_run_step` does in one process, in an actor of its own, with the same step body
(`serve/steps.py`): the step's metrics (`serve.learner.step_metrics`), the core's pairs and
`rm/pairwise_update.py` (`serve.learner.Learner`), the hacking monitor (`core.HackingResponse`), the steps' log
(`serve.metrics.ServiceLog`: `STATE_DIR/logs/metrics.jsonl`) and the checkpoint (`serve.checkpoint.ServiceCheckpoint`,
the one-process format, so either mode resumes the other's).

Publishing: a step that changed the RM returns the new weights (a CPU state dict) as its second return value. The
registry, which made the call, owns that object: it is put in the object store once, outlives this actor, and
every scoring replica fetches it by reference. Order: update, then checkpoint, then return, so a version the
registry adopts is one a restarted learner can reproduce. The learner numbers a new version one past the
registry's latest (`version_floor`) and past every number ever published from the state dir (`serve/checkpoint.py`'s
version log): after a kill that lost an update it had published without checkpointing, the learner's or the whole
service's, the numbers stay unique.

Restarts: the actor is created with `max_restarts=-1`; a new incarnation loads the latest checkpoint in `__init__`
(its counters, version and hacking state continue from there) and the registry sends the step it lost again.

The RM guard (`core/rm_health.py`) is the one-process service's: `Learner.learn` keeps a version only when its weights
are finite and its health in bounds, so a rejected step returns no weights and the replicas keep the last healthy
version; its state rides in the RM update's counters, which the checkpoint holds (`serve/learner.py`), so a new
incarnation resumes mid-guard. `status()["rm_health"]` carries its gauges.
"""

import logging
import math
import os
import time

import ray

from cooper_openrlhf.core import REWARD_MODES, HackingResponse
from cooper_openrlhf.serve.metrics import ServiceLog
from cooper_openrlhf.serve.published_names import FAILED_STEP, STEPS_COUNTER
from cooper_openrlhf.serve.replicated.registry import LEARNER_COUNTERS, worker_logging
from cooper_openrlhf.serve.steps import count_update, monitored_metrics, watch_and_log

logger = logging.getLogger(__name__)


class _Weights:
    """A state dict where `ServiceCheckpoint.save` expects a module (it reads `state_dict()`, and `parameters()` to
    refuse non-finite weights)."""

    def __init__(self, state_dict: dict):
        self._state_dict = state_dict

    def state_dict(self) -> dict:
        return self._state_dict

    def parameters(self):
        return iter(self._state_dict.values())


def cpu_state_dict(module) -> dict:
    """A copy of `module`'s weights on the CPU (what is published: training goes on in place)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


class LearnerActor:
    """See the module docstring. With `args.learn` it builds its learner and checkpointer as one process does
    (`serve.build.build_learner`); without, it runs the steps' monitor and log only."""

    def __init__(self, config, args, log_dir: str | None):
        worker_logging()
        self.config, self.args = config, args
        self.pay = REWARD_MODES[config.mode]
        self.learner = self.checkpointer = None
        if args.learn:
            from cooper_openrlhf.serve.build import build_learner

            self.learner, self.checkpointer = build_learner(args)
        restored = self.checkpointer.load() if self.checkpointer is not None else None
        self.state = restored.state if restored else None
        self.pinned = dict(restored.pinned) if restored else {}  # older versions a checkpoint kept for open groups
        self.version = self.state["version"] if self.state else 0
        counters = (self.state or {}).get("counters", {})
        self.counters = {key: counters.get(key, 0) for key in LEARNER_COUNTERS}
        self._checkpointed_updates = self.counters["updates"]
        self.hacking = HackingResponse(config.monitor, config.on_hacking)
        self.hacking.paying_rule = (self.state or {}).get("mode", config.mode) == "rule" and self.pay.source != "rule"
        self.log = ServiceLog(log_dir)
        self.probe = getattr(args, "probe", None)  # a serve.probing.ServiceProbe (--probe-every), built by cli.serve
        self._served = None  # without --learn, what the probes read: the RM the replicas serve, loaded when due
        self.registry_restarts = 0
        if restored:
            logger.info("learner resumed from %s: RM version %d, counters %s", restored.tag, self.version,
                        self.counters)

    def status(self) -> dict:
        """The version, counters and pay the registry adopts; the checkpoint's service state (None without one) and
        the versions whose weights this actor can give."""
        versions = ([self.version] if self.learner is not None else []) + sorted(self.pinned)
        return {"version": self.version, "counters": dict(self.counters), "paying_rule": self.hacking.paying_rule,
                "state": self.state, "versions": versions, "error": None,
                "rm_health": self.learner.health_gauges() if self.learner is not None else {}}

    def weights(self, version: int) -> dict:
        """A version's weights (the latest, or one a checkpoint kept); the caller owns the object."""
        if self.learner is not None and version == self.version:
            return cpu_state_dict(self.learner.trainer.model.module)
        if version in self.pinned:
            return self.pinned[version]
        raise KeyError(f"the learner holds no weights of RM version {version} (latest {self.version})")

    def pid(self) -> int:
        return os.getpid()

    def registry_restarted(self) -> int:
        """The group registry's restarts so far (it asks when it starts again: this actor outlives it)."""
        self.registry_restarts += 1
        return self.registry_restarts

    def run_step(self, index: int, groups: list, version_floor: int, pinned_refs: dict, waited: float, registry):
        """One step (`RewardService._run_step`): (status with "error", the new weights or None)."""
        self.counters[STEPS_COUNTER] = index + 1
        started = time.perf_counter()
        metrics = monitored_metrics(groups, self.pay)
        failure, weights = None, None
        if self.learner is not None:
            metrics["timing/serve_waited"] = waited
            try:
                updated, learned = self.learner.learn(groups, index)
                metrics.update(learned)
                if updated:
                    # one past the registry's and every version ever published here, on disk before it is returned
                    self.version = self.checkpointer.next_version(max(self.version, version_floor))
                    weights = cpu_state_dict(self.learner.trainer.model.module)
                    count_update(self.counters, learned)
            except Exception as exc:
                failure = exc
                metrics["cooper/rm_update_failed"] = 1.0
                self._discard_gradients()
            metrics["cooper/rm_version_after"] = float(self.version)
        try:
            if self.probe is not None and self.probe.due(index):  # before the monitor: its rules may read them
                metrics.update(self.probe.read(self._latest_scorer()))
            watch_and_log(index, metrics, self.hacking, self.counters, self.log, started)
            every = self.config.checkpoint_every
            if failure is None and self.checkpointer is not None and every \
                    and self.counters["updates"] - self._checkpointed_updates >= every:
                self._checkpoint(pinned_refs, registry)
        except Exception as exc:
            failure = failure or exc
        status = self.status()
        status["state"] = None  # the registry holds the live groups
        # the step's numbers for the front's /metrics (`STEP_METRICS_GAUGE`), as one process shows them
        status["step_metrics"] = {k: float(v) for k, v in metrics.items()
                                   if isinstance(v, (int, float)) and math.isfinite(v)}
        if failure is not None:
            logger.error("%s failed", FAILED_STEP.format(index=index), exc_info=failure)
            status["error"] = f"{type(failure).__name__}: {failure}"
        return status, weights

    def _latest_scorer(self):
        """An `rm.scorer.RMScorer` of the latest version: the weights this actor trains (between updates), or,
        learning off, the RM the replicas serve."""
        from cooper_openrlhf.rm.scorer import RMScorer
        from cooper_openrlhf.serve.build import served_scorer

        if self.learner is None:
            self._served = self._served or served_scorer(self.args)
            return self._served
        return RMScorer.of_trainer(self.learner.trainer, batch_size=self.args.max_batch, version=self.version)

    def _checkpoint(self, pinned_refs: dict, registry) -> str:
        """The one-process checkpoint: the engine, the registry's groups and counters with ours, the pinned
        versions' weights (fetched from the object store)."""
        state = ray.get(registry.checkpoint_state.remote())
        state = {**state, "version": self.version, "mode": "rule" if self.hacking.paying_rule else self.config.mode,
                 "counters": {**state["counters"], **self.counters}}
        pinned = {v: _Weights(ray.get(ref)) for v, ref in pinned_refs.items() if v != self.version}
        tag = self.checkpointer.save(state, pinned)
        self.state = state  # what `status` gives a registry that starts again
        self._checkpointed_updates = self.counters["updates"]
        logger.info("checkpoint %s of RM version %d", tag, self.version)
        return tag

    def _discard_gradients(self) -> None:
        try:
            self.learner.discard_gradients()
        except Exception:
            logger.exception("discarding the failed step's gradients failed too")

    def finish(self, pinned_refs: dict, registry) -> str | None:
        """Shutdown: a last checkpoint and the trained RM exported (its folder); None without learning."""
        self.log.close()
        if self.checkpointer is None:
            return None
        self._checkpoint(pinned_refs, registry)
        out = self.args.export_dir or os.path.join(self.args.state_dir, "final_rm")
        path = self.checkpointer.export(out)
        self.learner.pair_builder.close()
        logger.info("exported the trained RM (version %d) to %s", self.version, path)
        return str(path)
