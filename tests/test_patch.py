"""patches/openrlhf-0.11.2-remote-rm-trainable.patch applies to the pinned OpenRLHF and routes commands.

The patch is applied with `patch -p1` to a copy of the installed package in a temporary folder, which a
subprocess imports first (PYTHONPATH). That subprocess runs the patched `train_ppo_ray` as `__main__` on
five command lines. What happens after parsing and validation is not under test here (the e2e test runs
training): the two places where the patched script hands over -- `train_cooper(args)` and, on the stock
path, stock `train(args)` (seen at its `get_strategy` call, after `ray.is_initialized`) -- are replaced in
the subprocess by functions that report and stop.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PATCH = REPO / "patches" / "openrlhf-0.11.2-remote-rm-trainable.patch"

RUNNER = r"""
import json, runpy, sys
from cooper_openrlhf.runtime import install_cpu_runtime

install_cpu_runtime()
import openrlhf
import openrlhf.utils
import ray

import cooper_openrlhf.cli.train_cooper as train_cooper_module

assert openrlhf.__file__.startswith(sys.argv[1]), openrlhf.__file__


class HandedOver(Exception):
    pass


def cooper(args):
    raise HandedOver({"to": "cooper", "rm_lr": args.cooper.rm_lr, "reward_form": args.cooper.reward_form,
                      "eval_dataset": args.eval.dataset, "eval_steps": args.eval.steps,
                      "vllm_generate_batch_size": args.rollout.vllm_generate_batch_size,
                      "eps_clip_low_high": list(args.actor.eps_clip_low_high)})


def stock(args):
    raise HandedOver({"to": "stock", "remote_rm_trainable": args.remote_rm_trainable, "rm_lr": args.cooper.rm_lr})


train_cooper_module.train_cooper = cooper
openrlhf.utils.get_strategy = stock  # stock train(args) calls it first after ray.is_initialized()
ray.is_initialized = lambda: True

for argv in json.loads(sys.argv[2]):
    sys.argv = ["train_ppo_ray", *argv]
    try:
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=False)
        result = {"to": "nowhere"}
    except HandedOver as handed:
        result = handed.args[0]
    except SystemExit as exit_:
        result = {"exit": exit_.code}
    except Exception as exc:
        result = {"error": type(exc).__name__, "message": str(exc)}
    print("RESULT " + json.dumps(result), flush=True)
"""

BASE = ["--actor.model_name_or_path", "policy", "--data.prompt_dataset", "prompts.jsonl", "--data.label_key", "label",
        "--vllm.num_engines", "1", "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4",
        "--rollout.batch_size", "8"]


def test_the_patch_applies_to_the_pinned_openrlhf_and_dispatches_remote_rm_trainable(tmp_path):
    installed = Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0])
    shutil.copytree(installed, tmp_path / "openrlhf", ignore=shutil.ignore_patterns("__pycache__"))
    applied = subprocess.run(["patch", "-p1", "--forward", "-i", str(PATCH)], cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "FAILED" not in applied.stdout and "fuzz" not in applied.stdout  # applies cleanly to 0.11.2

    commands = [
        [*BASE, "--reward.model_name_or_path", "rm", "--remote_rm_trainable", "--cooper.rm_lr", "2e-6",
         "--cooper.reward_form", "discrete"],
        [*BASE, "--reward.model_name_or_path", "rm"],  # no Cooper flag: the stock path
        [*BASE, "--reward.model_name_or_path", "rm", "--cooper.rm_lr", "2e-6"],  # a Cooper flag, no --remote_rm_trainable
        [*BASE, "--remote_rm_trainable"],  # no RM to train: Cooper's start-up check
        ["--help"],
        # Held-out evaluation on the Cooper route (graded by the rule verifier): stock asserts a remote RM for it.
        [*BASE, "--reward.model_name_or_path", "rm", "--remote_rm_trainable", "--eval.dataset", "held.jsonl",
         "--eval.steps", "3"],
        [*BASE, "--reward.model_name_or_path", "rm", "--eval.dataset", "held.jsonl"],  # stock: still its assertion
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path), json.dumps(commands)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    results = [json.loads(line[len("RESULT "):]) for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 7, run.stdout[-4000:]
    cooper, stock, ignored, invalid, help_, cooper_eval, stock_eval = results

    # Cooper flags parsed, then OpenRLHF's own validation block ran before the hand-over.
    assert cooper == {"to": "cooper", "rm_lr": 2e-6, "reward_form": "discrete", "vllm_generate_batch_size": 8,
                      "eps_clip_low_high": [0.2, 0.2], "eval_dataset": None, "eval_steps": -1}
    assert (cooper_eval["to"], cooper_eval["eval_dataset"], cooper_eval["eval_steps"]) == ("cooper", "held.jsonl", 3)
    assert stock_eval["error"] == "AssertionError" and "--eval_dataset" in stock_eval["message"]
    assert stock == {"to": "stock", "remote_rm_trainable": False, "rm_lr": 1e-5}
    # Stock training would ignore the Cooper flag: it stops at start-up naming the missing flag.
    assert ignored["error"] == "CooperArgsError"
    assert "--cooper.rm_lr" in ignored["message"] and "without --remote_rm_trainable" in ignored["message"]
    assert invalid["error"] == "CooperArgsError"
    assert "--reward.model_name_or_path is required" in invalid["message"]
    assert help_ == {"exit": 0}
    assert "--remote_rm_trainable" in run.stdout and "--cooper.rm_updates_per_step" in run.stdout
