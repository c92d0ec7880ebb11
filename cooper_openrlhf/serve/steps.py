"""The service's step bodies, one copy for both hosts: what a request's samples are paid once scored, and what a
step (one trainer step, one RM update) does around it.

Per request (`serve.service.RewardService.score`, `serve/replicated/ingress.py`'s `RemoteService.score`):
`rm_item` is a sample as the RM reads it; `check_finite` refuses a non-finite logit (never paid nor learned from);
`paid_samples` pays the scored samples the service's reward (`core.pay`, the trainer's forms); `answers` gives
each sample its `Scored`, the recorded answer of an identical sample included.

Per step (`RewardService._run_step`, `serve/replicated/learner_actor.py`'s `run_step`): `monitored_metrics` is what the
hacking monitor reads of the step's groups; `count_update` counts an RM update that is published; `watch_and_log`
runs the hacking monitor, counts its alarm and writes the step to the steps' log and its one log line.
"""

import logging
import math
import time

from cooper_openrlhf.algo.metric_keys import ALARM
from cooper_openrlhf.core import PayConfig, RolloutVerdicts, rewards
from cooper_openrlhf.serve.contract import NonFiniteScore, Scored
from cooper_openrlhf.serve.groups import ScoredSample
from cooper_openrlhf.serve.learner import step_metrics
from cooper_openrlhf.serve.protocol import Sample
from cooper_openrlhf.serve.step_supervisor import step_summary

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------- a request
def rm_item(version: int, sample: Sample) -> tuple[int, str, str, str]:
    """(version, question, reference, completion) as the RM is asked to score it (its template normalises the
    completion, as the trainer's RM reads it)."""
    return version, sample.question, sample.reference, sample.completion


def check_finite(todo: list[int], logits: list[float]) -> None:
    """Raise `NonFiniteScore` naming the first sample (by its index in the request) whose RM logit is not finite."""
    for i, logit in zip(todo, logits):
        if not math.isfinite(logit):
            raise NonFiniteScore(f"sample {i}: the RM's logit is {logit}; it is not paid and not learned from")


def paid_samples(pay: PayConfig, samples: list[Sample], logits: list[float], outcomes: list,
                 paying_rule: bool) -> list[ScoredSample]:
    """The scored samples with the reward each is paid (`core.pay`; `paying_rule`: a hacking alarm switched
    the pay to the rule reward)."""
    if not samples:
        return []
    paid = rewards(pay, RolloutVerdicts.of([o.verdict for o in outcomes]), logits, paying_rule=paying_rule).paid
    return [ScoredSample(sample, logit, outcome, reward)
            for sample, logit, outcome, reward in zip(samples, logits, outcomes, paid.tolist())]


def answers(places: list, todo: list[int], scored: list[ScoredSample]) -> list[Scored]:
    """Per sample of a request, its `Scored`: scored now (`todo`, in order with `scored`) or answered before (its
    place's `known`); the version is its place's."""
    now = dict(zip(todo, scored))
    return [place.known if i not in now else Scored(now[i].reward, now[i].logit, now[i].outcome.verdict, place.version)
            for i, place in enumerate(places)]


# ---------------------------------------------------------------------------------------------- a step
def monitored_metrics(groups: list, pay: PayConfig) -> dict[str, float]:
    """What the hacking monitor reads of a step (`serve.learner.step_metrics`) and the versions that scored it."""
    metrics = step_metrics(groups, pay)
    versions = [group.version for group in groups]
    metrics["cooper/scored_version_min"], metrics["cooper/scored_version_max"] = min(versions), max(versions)
    return metrics


def count_update(counters: dict, learned: dict) -> None:
    """An RM update that is published: counted, with its valid pairs."""
    counters["updates"] += 1
    counters["pairs"] += int(learned.get("cooper/rm_valid_pairs", 0))


def watch_and_log(index: int, metrics: dict, hacking, counters: dict, log, started: float) -> None:
    """The step read by the hacking monitor (`core.HackingResponse`: with on_hacking rule_reward the rule pays from
    now on), its alarm counted, the step written to the steps' log (`serve.metrics.ServiceLog`) and logged in one
    line; `started`: its `time.perf_counter()` start."""
    metrics.update(hacking.watch(index, metrics))
    counters["alarms"] += int(metrics[ALARM])
    log.step(index, metrics)
    logger.info(step_summary(index, metrics, time.perf_counter() - started))
