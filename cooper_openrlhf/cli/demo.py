"""`python -m cooper_openrlhf.cli.demo`: a short, real Cooper run on a CPU machine (the README's main job).

Three stages, each a real tool of this package run as its own process, all under `--out`:
  1. prompts      synthetic arithmetic problems (data/synthetic.py) as an OpenRLHF prompt dataset
                  (`prompts.jsonl`: "prompt" = question + answer format instruction, "answer");
  2. VerifyRM     the MiniLM encoder with a new one-logit head, BCE-trained for one epoch by
                  `verifyrm train` on (question, reference, completion) triples whose completions are
                  written from templates and labelled by the rule verifier (math-verify) -- a quick stand-in
                  for the full hybrid annotation (`verifyrm annotate`), which needs minutes of LLM
                  generation per question on a CPU;
  3. Cooper RL    `train_cooper --remote_rm_trainable`: SmolLM2-135M-Instruct is the policy and, on the
                  same CPU vLLM engine, the assistant that writes negatives; the VerifyRM scores the rollouts
                  and is updated on the step's pairs after every GRPO step.
At the end it prints where the logs (tensorboard, per-step rollouts and pairs), checkpoints and exported
models are. Any stage that fails stops the demo with its exit status (its log file is named).
"""

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from cooper_openrlhf.data.synthetic import make_arithmetic_problems
from cooper_openrlhf.models import model_path

logger = logging.getLogger("cooper_openrlhf.demo")

INSTRUCTION = "Solve it step by step, then give the final answer as \\boxed{N}."
# Completion templates for the VerifyRM bootstrap: {answer} is the reference, or a wrong number.
COMPLETION_TEMPLATES = (
    "Let me compute. {question} The result is {answer}. So the answer is \\boxed{{{answer}}}.",
    "We work it out step by step and get {answer}.\nThe final answer is \\boxed{{{answer}}}",
    "{answer}",
    "Answer: {answer}",
)


def write_prompts(path: Path, n: int, seed: int) -> None:
    rows = [{"prompt": f"{p.question} {INSTRUCTION}", "answer": p.reference}
            for p in make_arithmetic_problems(n, seed=seed, max_operand=30)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_labelled_triples(path: Path, n: int, seed: int) -> dict[str, int]:
    """Right and wrong templated completions, each labelled by the rule verifier (not by construction)."""
    import random

    from cooper_openrlhf.verify.rule import Verdict, verify_one

    rng = random.Random(seed)
    rows, counts = [], {"correct": 0, "incorrect": 0}
    for problem in make_arithmetic_problems(n, seed=seed, max_operand=30):
        right = int(problem.reference)
        for template in COMPLETION_TEMPLATES:
            for answer in (right, right + rng.choice([-10, -2, -1, 1, 2, 3, 10])):
                completion = template.format(question=problem.question, answer=answer)
                label = int(verify_one(problem.reference, completion).verdict == Verdict.CORRECT)
                counts["correct" if label else "incorrect"] += 1
                # The RM reads the policy's prompt text as <question> during RL, so train it on the same text.
                rows.append({"question": f"{problem.question} {INSTRUCTION}", "reference": problem.reference,
                             "completion": completion, "label": label})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return counts


# Settings for a CPU-only machine (DeepSpeed's CPU accelerator, one thread per process, a small vLLM KV cache);
# where torch sees CUDA they would send a GPU machine down the CPU path, so they apply only without it.
CPU_ENVIRONMENT = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def run_environment() -> dict[str, str]:
    """Environment defaults of the demo's stages: offline always, CPU_ENVIRONMENT only where CUDA is absent."""
    from cooper_openrlhf.runtime import cuda_available

    defaults = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return defaults if cuda_available() else {**defaults, **CPU_ENVIRONMENT}


def run_stage(name: str, argv: list[str], log_path: Path) -> None:
    """Run one stage as a subprocess, teeing its output to `log_path`; a failure exits with its status."""
    logger.info("stage %s: %s", name, " ".join(argv))
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in process.stdout:
            log.write(line)
            sys.stdout.write(line)
        status = process.wait()
    if status != 0:
        logger.error("stage %s failed with exit status %d; its log: %s", name, status, log_path)
        raise SystemExit(status)
    logger.info("stage %s done in %.0f s", name, time.perf_counter() - started)


def cooper_argv(args, out: Path, rm: Path) -> list[str]:
    prompts_per_step = 4
    return [
        sys.executable, "-m", "cooper_openrlhf.cli.train_cooper", "--remote_rm_trainable",
        "--actor.model_name_or_path", model_path("smollm2-135m-instruct"),
        "--reward.model_name_or_path", str(rm),
        "--data.prompt_dataset", str(out / "prompts.jsonl"), "--data.input_key", "prompt",
        "--data.label_key", "answer", "--data.apply_chat_template", "--data.max_len", "1024",
        "--data.max_samples", str(prompts_per_step * args.steps),
        "--rollout.max_new_tokens", str(args.max_new_tokens), "--rollout.temperature", "0.7",
        "--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", str(prompts_per_step),
        "--rollout.micro_batch_size", "4", "--train.batch_size", str(prompts_per_step * 4),
        "--train.micro_batch_size", "2", "--train.seed", str(args.seed),
        "--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
        "--algo.kl.init_coef", "0.001",
        "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--reward.num_gpus_per_node", "1",
        "--vllm.num_engines", "1", "--vllm.sync_backend", "gloo", "--vllm.enforce_eager",
        "--ds.attn_implementation", "eager", "--ds.zero_stage", "2",  # --ds.param_dtype auto: the fast one here
        "--actor.adam.lr", "1e-6", "--cooper.rm_lr", "1e-5", "--cooper.rm_max_length", "512",
        "--cooper.negative_max_new_tokens", str(args.max_new_tokens),
        "--ckpt.save_steps", "1", "--ckpt.path", str(out / "ckpt"), "--ckpt.output_dir", str(out / "final"),
        "--logger.tensorboard_dir", str(out / "tensorboard"), "--cooper.sample_log_dir", str(out / "samples"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"),
                        help="run folder (default: runs/demo-<time>)")
    parser.add_argument("--steps", type=int, default=3, help="Cooper steps (4 prompts x 4 rollouts each)")
    parser.add_argument("--max-new-tokens", type=int, default=160, help="rollout and negative length, tokens")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for key, value in run_environment().items():
        os.environ.setdefault(key, value)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    write_prompts(out / "prompts.jsonl", 4 * args.steps, args.seed)
    counts = write_labelled_triples(out / "verifyrm_data.jsonl", 24, args.seed + 1)
    logger.info("VerifyRM bootstrap data: %s (rule-verified labels)", counts)
    run_stage("verifyrm", [
        sys.executable, "-m", "cooper_openrlhf.cli.verifyrm", "train", "--pretrain", model_path("minilm-l6-v2"),
        "--init-head", "--data", str(out / "verifyrm_data.jsonl"), "--out", str(out / "verifyrm"), "--epochs", "2",
        "--lr", "2e-4", "--max-length", "128", "--ds.zero_stage", "0", "--train.batch_size", "16",
        "--train.micro_batch_size", "8",
    ], out / "verifyrm.log")
    run_stage("cooper", cooper_argv(args, out, out / "verifyrm" / "best"), out / "cooper.log")

    print(f"""
Cooper demo finished: {out}
  VerifyRM (before RL)   {out / 'verifyrm' / 'best'}   metrics: {out / 'verifyrm' / 'metrics.jsonl'}
  logs (tensorboard)     tensorboard --logdir {out / 'tensorboard'}
  rollouts and pairs     {out / 'samples'}
  checkpoints            {out / 'ckpt'}
  final policy           {out / 'final'}
  final reward model     {out / 'final' / 'rm'}
  stage logs             {out / 'verifyrm.log'}, {out / 'cooper.log'}""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
