"""The learning service's checkpoints under faults: a version number never names two RMs (a kill -9 between a
publish and its checkpoint included), interrupted and failed saves leave nothing behind, and NaN or inf weights of
any dtype are neither saved nor exported (nor published: tests/test_rm_guard_service.py)."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "scripts" / "serve_checkpoint_faults.py"


def _weights(scorer, version: int) -> float:
    return float(next(scorer.model_of(version).parameters()).double().sum())


def test_versions_lost_with_a_killed_process_are_never_numbered_again(model_dir, tmp_path):
    """A process publishes versions 1 and 2 (its checkpoint holds version 1) and dies; the restarted one serves
    version 1's weights as version 1 and publishes the next as 3. The version log is on disk before each publish."""
    from cooper_openrlhf.rm.scorer import RMScorer
    from cooper_openrlhf.serve.checkpoint import ServiceCheckpoint, never_reuse_versions

    first = RMScorer.load(model_dir("tiny-qwen2-rm"), max_length=64)
    log = ServiceCheckpoint(None, str(tmp_path))  # the version log needs no engine
    never_reuse_versions(first, log)
    assert log.highest_published() == 0
    trained = first.model
    for k in (1, 2):
        with torch.no_grad():
            next(trained.parameters()).add_(k)
        assert first.publish(trained) == k and log.highest_published() == k
    checkpointed = copy.deepcopy(first.model_of(1))  # what the last checkpoint holds: version 1
    served_1 = _weights(first, 1)

    restarted = RMScorer(checkpointed, first.tokenizer, max_length=64, template_version=first.template_version,
                         batch_size=8, version=1)
    never_reuse_versions(restarted, ServiceCheckpoint(None, str(tmp_path)))
    assert restarted.latest == 1 and _weights(restarted, 1) == pytest.approx(served_1)  # its own number
    trained = copy.deepcopy(checkpointed)
    with torch.no_grad():
        next(trained.parameters()).add_(5)
    assert restarted.publish(trained) == 3 and ServiceCheckpoint(None, str(tmp_path)).highest_published() == 3
    assert _weights(restarted, 3) == pytest.approx(served_1 + 5 * 65536, rel=1e-6)
    assert restarted.publish(trained) == 4  # and on from there, one at a time


def test_an_unwritable_version_log_does_not_stop_publishing_and_numbers_keep_rising(tmp_path):
    """A full or read-only disk fails checkpoints and the version log alike: learning goes on (numbers still rise
    within the process) and the next writable moment records the highest."""
    from cooper_openrlhf.serve.checkpoint import ServiceCheckpoint

    checkpoints = ServiceCheckpoint(None, str(tmp_path / "state"))
    assert checkpoints.next_version(0) == 1
    (tmp_path / "state" / "rm").rename(tmp_path / "aside")
    (tmp_path / "state" / "rm").write_text("not a folder")
    assert [checkpoints.next_version(1), checkpoints.next_version(1)] == [2, 3]
    (tmp_path / "state" / "rm").unlink()
    (tmp_path / "aside").rename(tmp_path / "state" / "rm")
    assert checkpoints.next_version(3) == 4 and ServiceCheckpoint(None, str(tmp_path / "state")).highest_published() == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused_in_every_dtype(dtype, bad):
    from cooper_openrlhf.serve.checkpoint import NonFiniteWeights, refuse_non_finite

    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)).to(dtype)
    refuse_non_finite(module, "a finite RM")
    with torch.no_grad():
        module[1].weight.view(-1)[5] = bad
    with pytest.raises(NonFiniteWeights, match="the pinned RM has non-finite weights"):
        refuse_non_finite(module, "the pinned RM")


def _stage(state_dir: Path, stage: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(SCRIPT), str(state_dir), stage], capture_output=True, text=True,
                            timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-6000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_replicated_learners_pinned_weights_are_checked_as_modules_are():
    """The learner actor saves pinned versions from the object store as plain state dicts (`_Weights`): the same
    finiteness check as the one-process service's modules, no AttributeError failing every step's checkpoint."""
    from cooper_openrlhf.serve.checkpoint import NonFiniteWeights, refuse_non_finite
    from cooper_openrlhf.serve.replicated.learner_actor import _Weights

    refuse_non_finite(_Weights({"w": torch.ones(2), "steps": torch.tensor(3)}), "pinned version 1")
    with pytest.raises(NonFiniteWeights, match="pinned version 2"):
        refuse_non_finite(_Weights({"w": torch.tensor([1.0, float("nan")])}), "pinned version 2")


@pytest.mark.slow
def test_a_restart_after_a_kill_between_publish_and_checkpoint_numbers_past_the_lost_versions(model_dir, tmp_path):
    """`serve.build.build_service --learn` (the tiny RM on DeepSpeed), in two processes: the first checkpoints version
    0, publishes 1 and 2, and ends without saving them; the second serves version 0's weights as version 0 and
    publishes its next version as 3."""
    model_dir("tiny-qwen2-rm")
    died = _stage(tmp_path, "publish")
    assert died["version"] == 0 and {"published_1", "published_2"} <= set(died)
    resumed = _stage(tmp_path, "resume")
    assert resumed["version"] == 0 and resumed["served_weights"] == pytest.approx(died["checkpointed"])
    assert resumed["next"] == 3


@pytest.mark.slow
def test_failed_and_interrupted_saves_leave_nothing_and_non_finite_weights_are_never_written(model_dir, tmp_path):
    model_dir("tiny-qwen2-rm")
    seen = _stage(tmp_path, "saves")

    def tags(names):  # DeepSpeed also writes its zero_to_fp32.py beside the checkpoints
        return [name for name in names if name.startswith(("version", ".saving-"))]

    assert seen["first"] == "version0" and tags(seen["after_first"]) == ["version0"]  # the leftovers are gone
    assert seen["failed"] and tags(seen["after_failed"]) == ["version0"]  # and what the failed attempt wrote
    assert seen["refused"] == {**{f"pinned {d} {b}": True for d in ("float32", "bfloat16", "float16")
                                  for b in ("nan", "inf")}, "engine save": True, "engine export": True}
    assert tags(seen["after_refusals"]) == ["version0"] and not seen["exported"]
