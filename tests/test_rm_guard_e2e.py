"""End to end: `cli.train_cooper --remote_rm_trainable` at an RM learning rate 30x the default, on a local CPU Ray
cluster (tests/test_cooper_e2e.py's tiny models and launcher), without and with the RM guard.

The starting RM is the tiny RM warmed up by tests/scripts/rm_guard_learner.py, exported with its anchors beside it
as eval_split.jsonl (where the guard finds a VerifyRM recipe's held-out split by default), and the RM update trains
on that script's pairs (`--cooper.offline_pairs`: true pairs that teach "a bare \\boxed{N} pays"), so the collapse
does not hang on what the tiny policy happens to write. Without the guard the RM pays the anchors' wrong answers
like right ones within a few steps; with it no step is scored by a version out of bounds.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_cooper_e2e import _launch, _scalars

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "rm_guard_learner.py"
PAY_DRIFT, AUC_DROP = 0.3, 0.1  # the guard's defaults
STEPS = 9  # 3 episodes of the 12 prompts, 4 a step


@pytest.fixture(scope="module")
def guard_runs(tmp_path_factory, answering_policy, model_dir):
    model_dir("tiny-qwen2-rm")
    root = tmp_path_factory.mktemp("rm_guard_e2e")
    policy, rows = answering_policy
    (root / "policy").symlink_to(policy)
    (root / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    made = subprocess.run([sys.executable, str(SCRIPT), f"export={root / 'verifyrm'}"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert made.returncode == 0, made.stderr[-6000:]
    flags = ("--reward.model_name_or_path", str(root / "verifyrm" / "best"), "--cooper.rm_lr", "3e-4",
             "--cooper.offline_pairs", str(root / "verifyrm" / "pairs.jsonl"), "--train.num_episodes", "3",
             "--ckpt.save_steps", "100", "--cooper.rm_max_length", "128",
             "--cooper.rm_anchor_weight", "0")  # the paper's update: what the guard alone does with it
    runs = {}
    for mode in ("watch", "rollback"):
        work = root / mode
        _launch(work, root / "policy", str(root / "verifyrm" / "best"), *flags, "--cooper.rm_guard", mode)
        runs[mode] = (_scalars(work), (work / "run.log").read_text())
    return runs


def _series(scalars, name):
    values = scalars[f"train/cooper/rm_health/{name}"]
    return [values[step] for step in sorted(values)]


def test_without_the_guard_a_30x_rm_learning_rate_collapses_the_rm(guard_runs):
    scalars, log = guard_runs["watch"]
    assert len(_series(scalars, "auc")) == STEPS
    start_wrong = _series(scalars, "start_wrong_pay")[0]
    assert start_wrong < 0.2 and max(_series(scalars, "wrong_pay")) > start_wrong + PAY_DRIFT
    assert min(_series(scalars, "auc")) <= 0.6  # ranks right and wrong anchors as a coin would, or worse
    assert _series(scalars, "unhealthy_kept")[-1] >= 1 and "kept (--cooper.rm_guard watch)" in log


def test_with_the_guard_no_step_is_scored_by_a_version_out_of_bounds(guard_runs):
    scalars, log = guard_runs["rollback"]
    start_right, start_wrong = _series(scalars, "start_right_pay")[0], _series(scalars, "start_wrong_pay")[0]
    # each step's health after the guard's decision: the version that scores the next step
    for auc, best, right, wrong in zip(_series(scalars, "auc"), _series(scalars, "best_auc"),
                                       _series(scalars, "right_pay"), _series(scalars, "wrong_pay")):
        assert auc >= best - AUC_DROP and right >= start_right - PAY_DRIFT and wrong <= start_wrong + PAY_DRIFT
    assert _series(scalars, "rollbacks")[-1] >= 1 and "rolled back to the last healthy weights" in log
    assert max(_series(scalars, "unhealthy")) == 1.0  # it did stop a version (whose update_* values left a bound)
    assert scalars["train/cooper/rm_lr"][STEPS] < 3e-4
