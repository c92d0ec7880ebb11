"""The reward service's learner under an RM learning rate 30x the default: without the RM guard the RM collapses
within a few steps; with it no version out of bounds (or with non-finite weights) is ever published, and a
restarted service resumes mid-guard. One process runs every scenario (tests/scripts/rm_guard_learner.py says how
the collapse is made); about 20 s on 2 cores."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "rm_guard_learner.py"
AUC_DROP, PAY_DRIFT = 0.1, 0.3  # core.rm_health.GuardConfig's defaults, which the script's guard uses


@pytest.fixture(scope="module")
def scenarios(model_dir):
    model_dir("tiny-qwen2-rm")  # materialised, or a clear failure
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(SCRIPT), "watch,rollback,resume,nonfinite,anchored"], capture_output=True,
                            text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-6000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_without_the_guard_the_rm_collapses_within_a_few_steps(scenarios):
    steps = scenarios[0]["watch"]
    assert steps[0]["auc"] > 0.95 and steps[0]["right_pay"] - steps[0]["wrong_pay"] > 0.8  # healthy at first
    assert min(r["auc"] for r in steps) <= 0.6  # ranks right and wrong anchors as a coin would, or worse
    assert all(r["updated"] for r in steps)  # and every one of those versions was published
    assert steps[-1]["unhealthy_kept"] >= 1


def test_with_the_guard_no_version_out_of_bounds_is_ever_published(scenarios):
    results, log = scenarios
    steps = results["rollback"]
    start = results["watch"][0]  # the same warmed-up engine's first step, kept by both (healthy)
    base_right, base_wrong, best = start["right_pay"], start["wrong_pay"], start["auc"]
    for r in steps:
        if r["updated"]:  # the engine's RM now is the version published: measured here again
            assert r["auc"] >= best - AUC_DROP and r["right_pay"] >= base_right - PAY_DRIFT - 0.02
            assert r["wrong_pay"] <= base_wrong + PAY_DRIFT + 0.02
            best = max(best, r["auc"])
        else:  # rolled back: the last healthy weights, nothing new to publish
            assert r["weights_unchanged"] and r["unhealthy"] == 1.0
    assert steps[-1]["rollbacks"] >= 1 and steps[-1]["lr_scale"] < 1.0
    assert min(r["auc"] for r in steps) > 0.9
    assert "is out of bounds (wrong pay" in log and "rolled back to the last healthy weights" in log


def test_a_restarted_service_resumes_mid_guard(scenarios):
    resume = scenarios[0]["resume"]
    before, after = resume["before"], resume["after"]
    assert before[-1]["rollbacks"] == 1 and before[-1]["skipping"] == 3  # checkpointed right after the rollback
    # the restarted learner skips the 3 updates the checkpoint still owed, then trains again (at this rate the
    # update is rolled back once more, which starts another skip)
    assert [r["updated"] for r in after[:3]] == [False, False, False]
    assert [r["skipping"] for r in after[:3]] == [2, 1, 0] and after[2]["rollbacks"] == 1
    assert all(r["weights_unchanged"] for r in after[:3])
    assert after[3]["updated"] or (after[3]["rollbacks"] == 2 and after[3]["skipping"] == 3)


def test_non_finite_weights_are_never_published_even_without_a_guard(scenarios):
    (only,) = scenarios[0]["nonfinite"]
    assert not only["updated"] and only["weights_unchanged"] and only["weights_finite"]


def test_anchored_updates_keep_the_anchors_ranked_at_the_same_rate(scenarios):
    anchored, unanchored = scenarios[0]["anchored"], scenarios[0]["watch"]
    assert all(r["rm_anchor_rows"] == 8 for r in anchored)  # the BCE rows joined every update
    assert min(r["auc"] for r in anchored) > min(r["auc"] for r in unanchored) + 0.3
