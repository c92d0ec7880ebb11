"""Time of a Cooper step next to a static-RM GRPO step of the same configuration, stage by stage, in one run.

Launches `python -m cooper_openrlhf.cli.train_cooper` with identical flags without `--remote_rm_trainable`
(the static-RM arm: the same rollouts, verification and template scoring by the same RM, no negatives,
no RM update) and with it, alternating the two `--repeats` times (on a shared machine, alternation
spreads the load of others over both arms). Each step's `timing/*` scalars are read back from OpenRLHF's
tensorboard log. Step 1 of each launch is warm-up (vLLM's first batch, first DeepSpeed steps) and is left
out; every row is the median over the other steps of all launches of the arm, and the last line is the
ratio of the medians of `timing/step_total` (OpenRLHF's sum of the stage times of a step).

`timing/cooper_rm_update` is the time the step waits for the RM update after the policy update: with the
RM on its own devices the update runs beside the policy update, so the RM's own time (`cooper/rm_fit_seconds`,
shown separately, not part of the total) can exceed it. On a 2-core CPU machine "beside" means sharing
the cores, which a GPU cluster does not.

Default configuration (CPU, minutes): SmolLM2-135M-Instruct policy sampled at temperature 0.3 (it then
answers small-number arithmetic often enough for real positives and negatives), the tiny Qwen2 RM,
synthetic arithmetic prompts, 4 prompts x 4 rollouts.
Any extra train_cooper flag after `--` goes to both runs (e.g. the paper's configuration on a GPU node).

    python benchmarks/cooper_step_time.py [--steps 5] [--repeats 1] [--policy PATH] [--rm PATH] [--work DIR] [-- FLAGS...]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = [
    "timing/generation", "timing/cooper_decode", "timing/cooper_verify", "timing/cooper_negatives",
    "timing/cooper_score", "timing/make_experience", "timing/ppo_train", "timing/broadcast",
    "timing/cooper_rm_update", "timing/step_total",
]
PROMPTS_PER_STEP = 4


def write_prompts(path: Path, count: int) -> None:
    from cooper_openrlhf.data.synthetic import make_arithmetic_problems

    rows = [{"input": p.question, "label": p.reference} for p in make_arithmetic_problems(count, seed=0, max_operand=12)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def train_cooper_argv(args, prompts: Path, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "cooper_openrlhf.cli.train_cooper",
        "--actor.model_name_or_path", args.policy, "--reward.model_name_or_path", args.rm,
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--data.apply_chat_template", "--data.max_len", "1024", "--rollout.max_new_tokens", str(args.max_new_tokens),
        "--rollout.n_samples_per_prompt", "4", "--rollout.temperature", str(args.temperature),
        "--rollout.batch_size", str(PROMPTS_PER_STEP),
        "--rollout.micro_batch_size", "4", "--train.batch_size", str(4 * PROMPTS_PER_STEP), "--train.micro_batch_size", "4",
        "--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
        "--algo.kl.init_coef", "0.001", "--vllm.num_engines", "1", "--vllm.sync_backend", "gloo", "--vllm.enforce_eager",
        "--ds.attn_implementation", "eager", "--ds.zero_stage", "2",
        "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--reward.num_gpus_per_node", "1",
        "--cooper.rm_max_length", "512", "--cooper.negative_max_new_tokens", str(args.max_new_tokens),
        "--train.seed", "0", "--ckpt.output_dir", str(out / "out"), "--logger.tensorboard_dir", str(out / "tb"),
        *args.extra,
    ]


def run_arm(name: str, argv: list[str], out: Path) -> dict[str, list[float]]:
    """Run one arm; returns {tag: [value per step, in step order]} from its tensorboard log."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out.mkdir(parents=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    print(f"[{name}] running ({out / 'run.log'})", flush=True)
    start = time.perf_counter()
    with open(out / "run.log", "w") as log:
        result = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        sys.exit(f"[{name}] train_cooper failed with exit code {result.returncode}; see {out / 'run.log'}")
    print(f"[{name}] done in {time.perf_counter() - start:.0f} s (start-up included)", flush=True)
    (log_dir,) = [p for p in (out / "tb").iterdir() if p.is_dir()]
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag.removeprefix("train/"): [e.value for e in sorted(events.Scalars(tag), key=lambda e: e.step)]
            for tag in events.Tags()["scalars"]}


def median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="steps per arm (the first is warm-up)")
    parser.add_argument("--policy", default=None, help="policy path (default: smollm2-135m-instruct)")
    parser.add_argument("--rm", default=None, help="reward-model path (default: tiny-qwen2-rm)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.3, help="rollout temperature")
    parser.add_argument("--repeats", type=int, default=1, help="launches per arm, alternating static / Cooper")
    parser.add_argument("--work", default=None, help="folder for logs and outputs (default: a new temporary one)")
    parser.add_argument("extra", nargs="*", help="extra train_cooper flags for both runs (after --)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2 (step 1 is warm-up)")

    from cooper_openrlhf.models import model_path

    args.policy = args.policy or model_path("smollm2-135m-instruct")
    args.rm = args.rm or model_path("tiny-qwen2-rm")
    work = Path(args.work or tempfile.mkdtemp(prefix="cooper_step_time_"))
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prompts.jsonl"
    write_prompts(prompts, args.steps * PROMPTS_PER_STEP)

    static: dict[str, list[float]] = {}
    cooper: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        for name, arm, flags in (("static RM", static, []), ("Cooper", cooper, ["--remote_rm_trainable"])):
            out = work / f"{name.split()[0].lower()}-{repeat}"
            for tag, values in run_arm(name, [*train_cooper_argv(args, prompts, out), *flags], out).items():
                arm.setdefault(tag, []).extend(values[1:])  # step 1 of every launch is warm-up

    print(f"\nseconds per step, median of steps 2..{args.steps} of {args.repeats} launch(es) per arm (policy {Path(args.policy).name}, RM {Path(args.rm).name})")
    print(f"{'stage':<28} {'static RM':>10} {'Cooper':>10}")
    for stage in STAGES:
        a, b = median(static.get(stage)), median(cooper.get(stage))
        show = lambda v: f"{v:10.3f}" if v is not None else f"{'-':>10}"  # noqa: E731
        print(f"{stage.removeprefix('timing/'):<28} {show(a)} {show(b)}")
    fit = median(cooper.get("cooper/rm_fit_seconds"))
    if fit is not None:
        print(f"{'(RM update, overlapped)':<28} {'':>10} {fit:10.3f}")
    for tag, what in (("cooper/verified_accuracy", "verified-correct rollouts"), ("cooper/valid_pair_rate", "valid pairs per prompt")):
        if cooper.get(tag):
            print(f"{what} (Cooper arm, mean): {statistics.fmean(cooper[tag]):.2f}")
    total_static, total_cooper = median(static["timing/step_total"]), median(cooper["timing/step_total"])
    print(f"\nCooper / static-RM step time: {total_cooper / total_static:.2f}x "
          f"({total_cooper:.2f} s vs {total_static:.2f} s); logs in {work}")


if __name__ == "__main__":
    main()
