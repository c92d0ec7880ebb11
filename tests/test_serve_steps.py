"""The reward service's steps and restarts without HTTP or DeepSpeed: a step that raises is shown and the next
one runs; a restored group whose version a checkpoint lacks is re-pinned (counted) instead of failing forever;
an older version's weights come back into the scorer. (tests/test_serve_faults.py does the same with real
processes, a real folder that cannot be written and real kills.)"""

import asyncio
import json

import pytest
import torch

from cooper_openrlhf.serve.checkpoint import tag_order
from cooper_openrlhf.serve.groups import Group, GroupTracker, ScoredSample
from cooper_openrlhf.serve.metrics import ServiceLog
from cooper_openrlhf.serve.protocol import Sample
from cooper_openrlhf.serve.service import RewardService, ServiceConfig
from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome


class _Scorer:
    """Holds versions by number; scores nothing (the steps here are fed complete groups)."""

    def __init__(self, latest: int = 0, held=(0,)):
        self.latest, self.held = latest, set(held)

    def logits_of(self, items):
        return [0.0] * len(items)

    def versions(self):
        return set(self.held)

    def retire(self, in_use):
        return []

    def publish(self, module):
        self.latest += 1
        self.held.add(self.latest)
        return self.latest


class _Learner:
    """Fails its first `failures` updates, as a full disk or a bad batch would; counts gradient resets."""

    def __init__(self, failures: int):
        self.failures, self.discarded = failures, 0
        self.trainer = type("T", (), {"model": type("M", (), {"module": None})()})()

    def prepare(self, group):
        pass

    def learn(self, groups, index):
        if self.failures:
            self.failures -= 1
            raise OSError(28, "No space left on device")
        return True, {"cooper/rm_updated": 1.0, "cooper/rm_valid_pairs": 1.0}

    def discard_gradients(self):
        self.discarded += 1


def _group(prompt: str, size: int) -> Group:
    scored = [ScoredSample(Sample(prompt, "q", "1", f"c{k}"), 0.1 * k,
                           VerifyOutcome(Verdict.CORRECT if k % 2 else Verdict.INCORRECT, "1", 0.0), 0.5)
              for k in range(size)]
    return Group(-1, prompt, 0, 0.0, size, scored)


def run_steps(service: RewardService, prompts: tuple[str, ...]) -> list[tuple[str, dict]]:
    """One step per prompt (a complete group of 2 each), waiting for each to end; per step the service's learning
    status and gauges after it."""

    async def steps():
        await service.start()
        statuses = []
        for prompt in prompts:
            service.ready.append(_group(prompt, 2))
            service._wake_steps()
            for _ in range(200):
                await asyncio.sleep(0.01)
                if not service.ready and service.update_done.is_set():
                    break
            statuses.append((service.learning_status, await service.gauges()))
        await service.stop(save=False)
        return statuses

    return asyncio.run(steps())


def test_a_step_that_raises_is_shown_counted_and_the_next_step_runs(tmp_path):
    learner = _Learner(failures=1)
    service = RewardService(ServiceConfig(group_size=2, groups_per_update=1), _Scorer(), [lambda r, c: []],
                            ServiceLog(str(tmp_path), tensorboard=False), learner=learner)
    (failed, after_failure), (recovered, after_recovery) = run_steps(service, ("p0", "p1"))
    assert failed.startswith("failing: round 0: OSError") and "No space left" in failed
    assert after_failure["round_failures"] == 1 and after_failure["learning_failing"] == 1
    assert learner.discarded == 1  # the failed update's gradients are not carried into the next one
    assert recovered == "ok" and after_recovery["learning_failing"] == 0 and after_recovery["round_failures"] == 1
    assert after_recovery["updates"] == 1 and after_recovery["rounds"] == 2
    # The failed step is still watched and logged (the hacking monitor sees every step), marked as failed.
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("cooper/rm_update_failed", 0.0) for r in logged] == [1.0, 0.0]
    assert all("cooper/hacking_alarm" in r for r in logged)


def test_a_restored_group_whose_version_the_checkpoint_lacks_is_re_pinned_and_counted(tmp_path):
    """A checkpoint made before pinned versions were kept: the group's rest is scored by the restored version."""
    saved = GroupTracker(group_size=4)
    place = saved.reserve("p", latest_version=3)
    saved.record(place, _group("p", 1).scored[0])
    kept = saved.reserve("q", latest_version=5)
    saved.record(kept, _group("q", 1).scored[0])
    state = {"version": 5, "mode": "rm", "counters": {"updates": 5}, "groups": saved.state(), "ready": []}
    service = RewardService(ServiceConfig(group_size=4), _Scorer(latest=5, held=(5,)), [lambda r, c: []],
                            ServiceLog(None), state=state)
    assert sorted(g.version for g in service.groups.open.values()) == [5, 5]
    assert asyncio.run(service.gauges())["groups_repinned"] == 1.0
    assert service.groups.reserve("p", latest_version=6).version == 5  # the rest of the group joins it


def test_the_scorer_restores_an_older_versions_weights(model_dir):
    from cooper_openrlhf.rm.model import load_rm
    from cooper_openrlhf.rm.scorer import RMScorer

    model, tokenizer, version = load_rm(model_dir("tiny-qwen2-rm"))
    item = ("What is 1 + 1?", "2", "The answer is 2.")
    original = RMScorer(model, tokenizer, max_length=128, template_version=version, batch_size=4)
    before = original.logits_of([(0, *item)])[0]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    trained, _, _ = load_rm(model_dir("tiny-qwen2-rm"))
    with torch.no_grad():
        trained.score.weight.mul_(-1.0)
    restarted = RMScorer(trained, tokenizer, max_length=128, template_version=version, batch_size=4, version=1)
    restarted.restore(0, weights)
    old, new = restarted.logits_of([(0, *item), (1, *item)])
    assert old == pytest.approx(before, abs=1e-6) and new == pytest.approx(-before, abs=1e-4)


def test_checkpoint_tags_sort_in_saving_order():
    tags = ["version10", "version2.1", "version2", ".saving-version11", "latest", "version9.2"]
    assert sorted((t for t in tags if tag_order(t)), key=tag_order) == ["version2", "version2.1", "version9.2",
                                                                      "version10"]
