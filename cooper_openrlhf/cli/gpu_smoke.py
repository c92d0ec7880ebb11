"""The first thing to run on a GPU machine: every GPU-only path of the package, small, in about five minutes.

    bash scripts/gpu_smoke.sh [OUT_DIR]          # = python -m cooper_openrlhf.cli.gpu_smoke --out OUT_DIR

No GPU has run this package's CI (docs/cluster.md says what has); the CPU suite runs the same code with every
GPU boundary faked or swapped (gloo for NCCL, vLLM-CPU, no flash-attn kernels). This script crosses those
boundaries for real, with the tiny models `scripts/install.sh` materialises, one stage at a time:

  rm_actor       the trainable RM actor in bf16 with flash attention on the GPU: score, one pair update,
                 checkpoint, export
  verifyrm_train `verifyrm train` under the deepspeed launcher (ZeRO-2, bf16, flash attention)
  annotate       `verifyrm annotate` with a vLLM judge and a vLLM generator side by side on one GPU
  train_cooper   a colocated Cooper run (--train.colocate_all, vLLM and DeepSpeed sleep, NCCL weight sync) of
                 2 steps, then a second launch that resumes from its checkpoint and runs step 3

Each stage writes its log under OUT_DIR/<stage>.log and prints PASS or FAIL with that path; the exit code is the
number of failed stages. On a machine without CUDA, vLLM's GPU build or flash-attn's kernels it stops at once
with one line naming what is missing.
"""

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cooper_openrlhf.runtime.toolchain import put_tools_first_on_path

STAGES = ("rm_actor", "verifyrm_train", "annotate", "train_cooper")


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
    """Prompts and labelled VerifyRM rows of synthetic arithmetic (the smoke test needs no data download)."""
    from cooper_openrlhf.data.synthetic import make_arithmetic_problems

    out.mkdir(parents=True, exist_ok=True)
    problems = make_arithmetic_problems(16, seed=0, max_operand=20)
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": p.question, "label": p.reference}) + "\n" for p in problems))
    labelled = out / "labelled.jsonl"
    rows = [{"question": p.question, "reference": p.reference, "completion": f"The answer is {answer}.",
             "label": int(answer == p.reference)}
            for p in problems for answer in (p.reference, str(int(p.reference) + 1))]
    labelled.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"prompts": prompts, "labelled": labelled}


def stage_commands(out: Path, inputs: dict[str, Path], models) -> dict[str, list[list[str]]]:
    """The command(s) of each stage; `models(name)` gives a materialised model folder."""
    python = sys.executable
    rm, policy, smollm = models("tiny-qwen2-rm"), models("tiny-qwen2-policy"), models("smollm2-135m-instruct")
    train = [python, "-m", "cooper_openrlhf.cli.train_cooper", "--remote_rm_trainable",
             "--actor.model_name_or_path", policy, "--reward.model_name_or_path", rm,
             "--data.prompt_dataset", str(inputs["prompts"]), "--data.input_key", "input", "--data.label_key", "label",
             "--data.apply_chat_template", "--data.max_len", "1024", "--rollout.max_new_tokens", "32",
             "--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", "4", "--rollout.micro_batch_size", "4",
             "--train.batch_size", "16", "--train.micro_batch_size", "4", "--train.num_episodes", "1",
             "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
             "--vllm.num_engines", "1", "--vllm.sync_backend", "nccl", "--vllm.gpu_memory_utilization", "0.3",
             "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep",
             "--ds.zero_stage", "2", "--ds.param_dtype", "bf16", "--ds.attn_implementation", "flash_attention_2",
             "--actor.num_gpus_per_node", "1", "--reward.num_gpus_per_node", "1",
             "--cooper.negative_max_new_tokens", "32", "--cooper.rm_max_length", "512",
             "--ckpt.save_steps", "1", "--ckpt.path", str(out / "train_cooper" / "ckpt"),
             "--ckpt.output_dir", str(out / "train_cooper" / "final"),
             "--logger.tensorboard_dir", str(out / "train_cooper" / "tensorboard")]
    first = [*train, "--data.max_samples", "12"]  # 3 steps of 4 prompts, a checkpoint after each
    # The resume: a fresh checkpoint folder holding only step 2 (policy and RM), then the same run with
    # --ckpt.load_enable, which must go on at step 3.
    ckpt, resumed = out / "train_cooper" / "ckpt", out / "train_cooper" / "resumed_ckpt"
    copy_step_two = ["bash", "-c", "set -e; rm -rf \"$2\"; for part in _actor _rm; do mkdir -p \"$2/$part\"; "
                     "cp -r \"$1/$part/global_step2\" \"$2/$part/\"; echo global_step2 > \"$2/$part/latest\"; done",
                     "copy", str(ckpt), str(resumed)]
    resume = [*train, "--data.max_samples", "12", "--ckpt.load_enable", "--ckpt.path", str(resumed),
              "--ckpt.output_dir", str(out / "train_cooper" / "resumed_final")]
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
        "train_cooper": [first, copy_step_two, resume],
    }


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

    argv = ["--remote_rm_trainable", "--ds.param_dtype", "bf16", "--ds.attn_implementation", "flash_attention_2",
            "--cooper.rm_lr", "1e-4", "--cooper.rm_warmup_ratio", "0", "--cooper.rm_micro_batch_size", "2",
            "--ckpt.path", str(out / "rm_actor" / "ckpt")]
    strategy = get_strategy(parse_openrlhf_args(argv, add_cooper_args(openrlhf_ppo_parser())))
    ray.init()
    group = RayActorGroup(1, 1, TrainableRewardModelActor, num_gpus_per_actor=1)
    ray.get(group.async_init_model_from_pretrained(strategy, model_path("tiny-qwen2-rm"), 4, strategy.args.cooper))
    (actor,) = group._actor_handlers
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
def run_stage(name: str, commands: list[list[str]], log: Path) -> bool:
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as handle:
        for command in commands:
            handle.write("$ " + " ".join(command) + "\n")
            handle.flush()
            code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT).returncode
            if code:
                handle.write(f"exit code {code}\n")
                break
    ok = code == 0
    print(f"{'PASS' if ok else 'FAIL'}  {name:<15} {time.perf_counter() - started:6.0f} s  log: {log}", flush=True)
    return ok


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cooper_openrlhf.cli.gpu_smoke", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu_smoke", help="folder for the stages' outputs and logs")
    parser.add_argument("--only", choices=STAGES, action="append", help="run only this stage (repeatable)")
    parser.add_argument("--stage", choices=["rm_actor"], help=argparse.SUPPRESS)  # a stage's own process
    parser.add_argument("--print-commands", action="store_true", help="print each stage's commands, run nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out).resolve()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    put_tools_first_on_path()  # FusedAdam is JIT-built on first use
    if args.stage == "rm_actor":
        run_rm_actor_stage(out)
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
    failed = sum(not run_stage(name, commands[name], out / f"{name}.log") for name in stages)
    print(f"gpu_smoke: {len(stages) - failed} of {len(stages)} stages passed; outputs under {out}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
