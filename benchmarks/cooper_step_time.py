"""Time of a Cooper step next to a static-RM GRPO step of the same configuration, per negative source, in one run.

Launches `python -m cooper_openrlhf.cli.train_cooper` with identical flags: without `--remote_rm_trainable`
(the static-RM arm: the same rollouts, verification and template scoring by the same RM, no negatives, no
RM update) and with it once per `--negative-source` (assistant, rollout, mixed; each as shipped, its RM guard on
with 64 labelled rows and the probe suite as anchors: `guard_flags`), alternating the arms
`--repeats` times (on a shared machine, alternation spreads the load of others over every arm). Each step's
scalars are read back from OpenRLHF's tensorboard log; step 1 of each launch is warm-up (vLLM's first
batch, first DeepSpeed steps) and is left out; every number is the median over the other steps.

Two totals per arm:
- wall: `timing/step_total`, OpenRLHF's sum of the step's stage times. The trainer's `timing/*` keys are
  the time the step WAITS in each stage, so overlapped work (the assistant's rewrites beside RM scoring
  and experience making, the RM update beside the policy update) is counted once.
- critical path: the step's length if each device did its own stages (`critical_path`): the engines
  generate the rollouts and then the rewrites; the RM scores and then trains; the actor makes experience
  and then trains; the weight sync waits for the policy update and the rewrites. On a 2-core CPU machine
  every stage shares the same cores, so overlap cannot save wall time there; the critical path is what the
  same stages give on separate GPUs.

Default configuration (CPU, minutes): SmolLM2-135M-Instruct policy sampled at the paper's temperature 0.7
(at 0.3 it verified only 3-5% of its rollouts and the assistant arm built no pair), the tiny Qwen2 RM,
synthetic arithmetic prompts, 4 prompts x `--n-samples` rollouts (8 by default, the paper's n). The policy's
learning rate is 0 by default (`--policy-lr`): the update still runs in full (forward, backward, optimizer
step, weight sync), but every arm's policy then stays the same at every step (same weights, same engine
seed), so the arms differ by Cooper's own stages, and their rollouts only by sampling: the assistant's rewrites draw
from the same engine's random stream, and the CPU engine's sampling is not bit-reproducible across launches. With a learning policy each arm's response lengths
drift apart within a few steps and move generation and training time for reasons that are not Cooper's cost.
Any extra train_cooper flag after `--` goes to every run (e.g. the paper's configuration on a GPU node).

    python benchmarks/cooper_step_time.py [--steps 4] [--n-samples 8] [--negative-source assistant,rollout,mixed]
        [--repeats 1] [--policy PATH] [--rm PATH] [--work DIR] [-- FLAGS...]
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
# Each stage's own duration (not the time the step waited for it), for the critical path. OpenRLHF's ppo_train is
# the policy update alone; its timing/broadcast includes the sync's wait for the rewrites, the timeline span does not.
OWN_TIME = {
    "generation": "timing/generation", "decode": "timing/cooper_decode", "verify": "timing/cooper_verify",
    "negatives": "cooper/negatives_seconds", "score": "timing/cooper_score", "make_experience": "timing/make_experience",
    "policy_fit": "timing/ppo_train", "rm_fit": "cooper/rm_fit_seconds", "broadcast": "timeline/broadcast",
}


def critical_path(t: dict[str, float]) -> float:
    """Length of one step when each device runs its own stages as soon as their inputs are ready.

    t: own duration per stage (missing = 0). Devices: engines (generation, then the rewrites), RM (score,
    then its update, which needs the pairs), actor (make_experience, which needs the rewards, then the
    policy update), CPU (decode, verify). The weight sync needs the policy update and idle engines.
    """
    get = lambda stage: t.get(stage, 0.0)  # noqa: E731
    verified = get("generation") + get("decode") + get("verify")
    negatives_end = verified + get("negatives")
    score_end = verified + get("score")
    policy_end = score_end + get("make_experience") + get("policy_fit")
    rm_end = max(negatives_end, score_end) + get("rm_fit")
    broadcast_end = max(policy_end, negatives_end) + get("broadcast")
    return max(broadcast_end, rm_end)


Steps = dict[tuple[int, int], float]  # (launch, step) -> value


def own_times(scalars: dict[str, Steps]) -> list[dict[str, float]]:
    """Per timed step, each stage's own duration (OWN_TIME; timeline spans as end - start).

    Aligned by (launch, step), not by position: a key the trainer logs on some steps only (the RM's fit is
    reported with the step it finished in) must not shift onto another step's values.
    """
    rows = []
    for step in sorted(scalars["timing/step_total"]):
        row = {}
        for stage, key in OWN_TIME.items():
            if key.startswith("timeline/"):
                starts, ends = scalars.get(f"{key}_start", {}), scalars.get(f"{key}_end", {})
                if step in starts and step in ends:
                    row[stage] = ends[step] - starts[step]
            elif step in scalars.get(key, {}):
                row[stage] = scalars[key][step]
        rows.append(row)
    return rows


PROMPTS_PER_STEP = 4
SOURCES = ("assistant", "rollout", "mixed")


def write_prompts(path: Path, count: int) -> None:
    from cooper_openrlhf.data.synthetic import make_arithmetic_problems

    rows = [{"input": p.question, "label": p.reference} for p in make_arithmetic_problems(count, seed=0, max_operand=12)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def labelled_rows(path: Path, count: int = 64) -> None:
    """Labelled rows for the RM guard's anchors (`--cooper.rm_anchors`): right and wrong sums, half each."""
    rows = [{"question": f"What is {a} + {b}?", "reference": str(a + b),
             "completion": f"{a} + {b} = {a + b + wrong}. The answer is \\boxed{{{a + b + wrong}}}.",
             "label": int(not wrong)} for a in range(count // 4) for b in (3, 7) for wrong in (0, 1)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows[:count]))


def guard_flags(work: Path, prompts: Path) -> list[str]:
    """A Cooper step as shipped runs the RM guard, which needs anchors: labelled rows and the probe suite on 4 of
    the prompts' problems (`--eval.dataset` names them; no held-out evaluation runs, `--eval.steps` stays off)."""
    labelled_rows(work / "anchors.jsonl")
    return ["--cooper.rm_anchors", str(work / "anchors.jsonl"), "--eval.dataset", str(prompts),
            "--cooper.rm_anchor_probe_problems", "4"]


def train_cooper_argv(args, prompts: Path, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "cooper_openrlhf.cli.train_cooper",
        "--actor.model_name_or_path", args.policy, "--reward.model_name_or_path", args.rm,
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--data.apply_chat_template", "--data.max_len", "1024", "--rollout.max_new_tokens", str(args.max_new_tokens),
        "--rollout.n_samples_per_prompt", str(args.n_samples), "--rollout.temperature", str(args.temperature),
        "--rollout.batch_size", str(PROMPTS_PER_STEP), "--rollout.micro_batch_size", "4",
        "--train.batch_size", str(args.n_samples * PROMPTS_PER_STEP), "--train.micro_batch_size", "4",
        "--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
        "--algo.kl.init_coef", "0.001", "--vllm.num_engines", "1", "--vllm.sync_backend", "gloo", "--vllm.enforce_eager",
        "--ds.attn_implementation", "eager", "--ds.zero_stage", "2", "--ds.param_dtype", args.dtype,
        "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--reward.num_gpus_per_node", "1",
        "--cooper.rm_max_length", "512", "--cooper.negative_max_new_tokens", str(args.max_new_tokens),
        "--actor.adam.lr", str(args.policy_lr), "--train.seed", "0",
        "--ckpt.output_dir", str(out / "out"), "--logger.tensorboard_dir", str(out / "tb"),
        *args.extra,
    ]


def run_arm(name: str, argv: list[str], out: Path) -> dict[str, dict[int, float]]:
    """Run one arm; returns {tag: {step: value}} from its tensorboard log."""
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
    return {tag.removeprefix("train/"): {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def median(values: Steps | list[float] | None) -> float | None:
    """Median of a list, or of a (launch, step) -> value mapping's values; None when empty."""
    values = list(values.values()) if isinstance(values, dict) else values
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="steps per arm (the first is warm-up)")
    parser.add_argument("--n-samples", type=int, default=8, help="rollouts per prompt (the paper's n = 8)")
    parser.add_argument("--negative-source", default=",".join(SOURCES),
                        help=f"comma-separated Cooper arms to time, of {SOURCES}")
    parser.add_argument("--policy", default=None, help="policy path (default: smollm2-135m-instruct)")
    parser.add_argument("--rm", default=None, help="reward-model path (default: tiny-qwen2-rm)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.7, help="rollout temperature (the paper's 0.7)")
    parser.add_argument("--policy-lr", type=float, default=0.0,
                        help="policy learning rate; 0 (default) keeps every arm's rollouts identical (see above)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                        help="--ds.param_dtype of every arm (auto: the CPU's fast dtype, see runtime/dtype.py)")
    parser.add_argument("--repeats", type=int, default=1, help="launches per arm, alternating the arms")
    parser.add_argument("--work", default=None, help="folder for logs and outputs (default: a new temporary one)")
    parser.add_argument("extra", nargs="*", help="extra train_cooper flags for every run (after --)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2 (step 1 is warm-up)")
    sources = [name.strip() for name in args.negative_source.split(",") if name.strip()]
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown or not sources:
        parser.error(f"--negative-source: unknown {unknown}; valid: {list(SOURCES)}")

    from cooper_openrlhf.models import model_path

    args.policy = args.policy or model_path("smollm2-135m-instruct")
    args.rm = args.rm or model_path("tiny-qwen2-rm")
    work = Path(args.work or tempfile.mkdtemp(prefix="cooper_step_time_"))
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prompts.jsonl"
    write_prompts(prompts, args.steps * PROMPTS_PER_STEP)

    guard = guard_flags(work, prompts)  # the Cooper arms as shipped: the RM guard on
    arms = {"static": []} | {f"cooper-{source}": ["--remote_rm_trainable", "--cooper.negative_source", source, *guard]
                             for source in sources}
    scalars: dict[str, dict[str, Steps]] = {name: {} for name in arms}
    for repeat in range(args.repeats):
        for name, flags in arms.items():
            out = work / f"{name}-{repeat}"
            for tag, values in run_arm(name, [*train_cooper_argv(args, prompts, out), *flags], out).items():
                scalars[name].setdefault(tag, {}).update(  # step 1 of every launch is warm-up
                    {(repeat, step): value for step, value in values.items() if step > 1})
    report(args, scalars, work)


def report(args, scalars: dict[str, dict[str, Steps]], work: Path) -> None:
    names = list(scalars)
    show = lambda v: f"{v:10.3f}" if v is not None else f"{'-':>10}"  # noqa: E731
    print(f"\nseconds per step, median of steps 2..{args.steps} of {args.repeats} launch(es) per arm "
          f"(policy {Path(args.policy).name}, RM {Path(args.rm).name}, {PROMPTS_PER_STEP} prompts x {args.n_samples})")
    print(f"{'wall time waited in':<26}" + "".join(f"{name:>18}" for name in names))
    for stage in STAGES:
        print(f"{stage.removeprefix('timing/'):<26}" + "".join(f"{show(median(scalars[n].get(stage))):>18}" for n in names))
    print(f"\n{'own time of (timeline)':<26}" + "".join(f"{name:>18}" for name in names))
    own = {name: own_times(values) for name, values in scalars.items()}
    for stage in OWN_TIME:
        print(f"{stage:<26}" + "".join(f"{show(median([r[stage] for r in own[n] if stage in r])):>18}" for n in names))
    for tag, what in (("cooper/verified_accuracy", "verified-correct rollouts"), ("cooper/valid_pair_rate", "valid pairs / prompt"),
                      ("cooper/pairs_from_rollout", "pairs from rollouts")):
        print(f"{what:<26}" + "".join(f"{show(statistics.fmean(scalars[n][tag].values()) if scalars[n].get(tag) else None):>18}"
                                      for n in names))
    wall = {name: median(values["timing/step_total"]) for name, values in scalars.items()}
    path = {name: median([critical_path(row) for row in own[name]]) for name in names}
    print(f"\n{'ratio to the static step':<26}" + "".join(f"{name:>18}" for name in names))
    print(f"{'wall (this machine)':<26}" + "".join(f"{wall[n] / wall['static']:17.2f}x" for n in names))
    print(f"{'critical path (devices)':<26}" + "".join(f"{path[n] / path['static']:17.2f}x" for n in names))
    print(f"\nlogs in {work}")


if __name__ == "__main__":
    main()
