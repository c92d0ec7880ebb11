"""What each launcher runs, built from its environment variables and checked before anything is submitted.

One function per stage turns the launcher's variables into the exact command(s) the job will run and checks
them: every flag through the entry point's own parser (`EntryPoints`: `train_cooper.parse_args`, which runs
OpenRLHF's own parser and validation; `verifyrm`'s parser; `evaluate`'s `build_parser()`; they live in cli/, a
layer above this one, and cli/launch_plans.py passes them in), the GPU placement (`cluster/placement.py`), model
folders, data rows, batch sizes and output folders (`cluster/checks.py`), and a run folder's checkpoints against the command
that wrote them (`cluster/launch_record.py`). `cli/preflight.py` is the shell's entry.

  plan_rl(env)              Cooper / static-RM / rule arm on N nodes: train_cooper argv + placement + Ray env
  plan_annotate(env)        VerifyRM annotation, one shard of the prompts per array task (resumable per shard)
  plan_verifyrm_train(env)  VerifyRM BCE training on the GPUs of one node under the deepspeed launcher
  plan_evaluate(env)        benchmark evaluation, one checkpoint per array task
  plan_report(env)          cli.report over the arms' run folders (the chain's last stage)

The RL defaults are the official Cooper recipe's (ZJU-REAL/Cooper `recipe/cooper/`) where the paper is
silent; docs/cluster.md lists every value, its source, and where this package departs.
"""

import argparse
import contextlib
import io
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from cooper_openrlhf.algo.registry import NEGATIVE_SOURCES
from cooper_openrlhf.cluster.annotation_shards import check_annotated, shard_bounds, shard_paths
from cooper_openrlhf.cluster.arms import ARMS, PAPER_ARMS, train_cooper_argv
from cooper_openrlhf.cluster.checks import (
    Env,
    PreflightError,
    check_batch_sizes,
    check_model_dir,
    check_prompts_prepared,
    check_rows_have_keys,
    check_verify_rm,
    check_writable_dir,
    cpu_mode,
    read_rows,
)
from cooper_openrlhf.cluster.launch_record import check_resumable
from cooper_openrlhf.data.benchmarks import DEFAULT_BENCHMARKS
from cooper_openrlhf.cluster.placement import Placement, PlacementError, plan_placement
from cooper_openrlhf.runtime.registry import Registry
from cooper_openrlhf.runtime.secrets import SECRET_FLAGS, WANDB_KEY_FROM_ENV



@dataclass
class Plan:
    """commands: one argv per task (one for single jobs). notes: what the user should know (printed)."""

    stage: str
    commands: list[list[str]]
    notes: list[str] = field(default_factory=list)
    placement: Placement | None = None
    runtime_env: dict | None = None


@dataclass(frozen=True)
class EntryPoints:
    """The parsers every planned command passes through: its entry point's own, in cli/ (cli/launch_plans.py).

    check_train_cooper(argv, gpus_per_node): train_cooper's parse of `argv` (the words after `python -m ...`) for
        the job's nodes; raises PreflightError naming what it rejects.
    verifyrm_parser(), evaluate_parser(): the `verifyrm` and `evaluate` CLIs' argparse parsers."""

    check_train_cooper: Callable[[list[str], int], None]
    verifyrm_parser: Callable[[], argparse.ArgumentParser]
    evaluate_parser: Callable[[], argparse.ArgumentParser]


def parse_or_fail(what: str, parse) -> object:
    """Run a parser; argparse's exit becomes a PreflightError carrying its message."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return parse()
    except SystemExit as exc:
        message = captured.getvalue().strip().splitlines()
        raise PreflightError(f"{what}: {message[-1] if message else f'parser exited with {exc.code}'}") from None


# --------------------------------------------------------------------------------------------- RL


def _rl_nodes(env: Env) -> int:
    """NODES, checked against the allocation inside the job (a job never silently runs on fewer nodes than asked)."""
    allocated = env.int("SLURM_JOB_NUM_NODES", None) if env.get("SLURM_JOB_ID") else None
    nodes = env.int("NODES", allocated or 1, minimum=1)
    if allocated is not None and nodes != allocated:
        raise PreflightError(f"NODES={nodes}: the job's allocation has {allocated} node(s) (SLURM_JOB_NUM_NODES); "
                             f"submit with --nodes={nodes} (bash launch_scripts/cooper_slurm.sbatch does) or set NODES="
                             f"{allocated}")
    return nodes


def _rl_placement(env: Env, arm: str, assistant_model: bool) -> Placement:
    """The placement of one arm. CPU mode: one logical slot per role (actor+ref, RM, one engine, the assistant),
    CPU_SLOTS_PER_NODE per node (default: the roles spread evenly over the nodes, so a 2-node run uses both)."""
    nodes = _rl_nodes(env)
    small = cpu_mode(env)
    actor = env.int("ACTOR_GPUS", 1 if small else None)
    rm = env.int("RM_GPUS", (0 if ARMS[arm].reward == "rule" else 1) if small else None, minimum=0)
    engines = env.int("VLLM_ENGINES", 1 if small else None)
    if small:
        roles = actor + rm + engines * env.int("VLLM_TP", 1) + (1 if assistant_model and ARMS[arm].trains_rm else 0)
        slots = env.int("CPU_SLOTS_PER_NODE", -(-roles // nodes))
    else:
        slots = env.int("GPUS_PER_NODE", env.int("SLURM_GPUS_ON_NODE", 8), minimum=1)
    try:
        return plan_placement(nodes, slots, arm=arm, assistant_model=assistant_model, actor_gpus=actor, rm_gpus=rm,
                              vllm_engines=engines, vllm_tp=env.int("VLLM_TP", 1), colocate_all=env.flag("COLOCATE_ALL"))
    except PlacementError as exc:
        raise PreflightError(str(exc)) from None


def rl_arm(env: Env) -> tuple[str, str | None]:
    """(ARM, the assistant: a model folder, 'policy', or None when the arm writes no negatives with one)."""
    arm = env.choice("ARM", "cooper", PAPER_ARMS)
    negative_source = env.choice("NEGATIVE_SOURCE", "assistant", NEGATIVE_SOURCES)
    assistant = None
    if ARMS[arm].trains_rm and NEGATIVE_SOURCES[negative_source].writes_rewrites:
        assistant = env.require("ASSISTANT_MODEL", "the model that rewrites correct rollouts into wrong ones "
                                "(a folder, or 'policy' for the policy on its own engines)")
    return arm, assistant


def rl_placement(env: Env) -> Placement:
    """The RL launcher's placement from its variables alone (ray_cluster.sh's slots per node come from it)."""
    arm, assistant = rl_arm(env)
    return _rl_placement(env, arm, assistant_model=assistant not in (None, "policy"))


def _warmup_ratio(env: Env, prompts: int, n: int, rollout_batch: int, train_batch: int, episodes: int) -> float:
    """OpenRLHF's warm-up ratio giving WARMUP_ROLLOUT_STEPS rollout steps of warm-up (verl's lr_warmup_steps=20).

    OpenRLHF schedules per optimizer step: max_steps = prompts * n // train_batch * episodes (trainer/ppo_trainer.py),
    and one rollout step makes rollout_batch * n / train_batch optimizer steps.
    """
    warmup_rollout_steps = env.int("WARMUP_ROLLOUT_STEPS", 20, minimum=0)
    max_steps = prompts * n // train_batch * episodes
    if max_steps < 1:
        raise PreflightError(f"TRAIN_BATCH_SIZE={train_batch}: PROMPTS has {prompts} rows x N_SAMPLES={n}, fewer "
                             "samples than one training batch: no optimizer step would run")
    warmup_steps = warmup_rollout_steps * (rollout_batch * n // train_batch)
    if not warmup_steps:
        return 0.0
    # OpenRLHF warms up for ceil(max_steps * ratio) steps: aim between two integers so that rounding cannot add one.
    return min(0.5, (warmup_steps - 0.5) / max_steps)


def plan_rl(env: Env, extra_args: list[str] = (), *, entry: EntryPoints) -> Plan:
    """The train_cooper command of one arm, with its placement; every flag parsed by train_cooper itself."""
    arm, assistant = rl_arm(env)
    negative_source = env.choice("NEGATIVE_SOURCE", "assistant", NEGATIVE_SOURCES)
    policy = env.require("POLICY", "the policy model folder (the paper: Qwen2.5-1.5B-Instruct)")
    prompts = env.require("PROMPTS", "a prompt file written by `cooper prompts` "
                          "(question with the answer-format instruction, reference answer)")
    out = env.require("OUT", "the run folder (checkpoints, final policy, tensorboard, samples)")
    verify_rm = env.require("VERIFY_RM", "a VerifyRM export (verifyrm train's best/)") if ARMS[arm].reward == "rm" else None
    input_key, label_key = env.get("INPUT_KEY", "question"), env.get("LABEL_KEY", "answer")

    check_model_dir(env, "POLICY", policy)
    if verify_rm:
        check_model_dir(env, "VERIFY_RM", verify_rm)
    if assistant not in (None, "policy"):
        check_model_dir(env, "ASSISTANT_MODEL", assistant)
    rows = read_rows("PROMPTS", prompts)
    check_prompts_prepared(prompts, rows, input_key, label_key)
    check_writable_dir("OUT", out)
    notes = []
    if not any("instruction" in row for row in rows[:1]):
        notes.append(f"PROMPTS={prompts}: rows carry no 'instruction' field; OpenRLHF ignores --data.input_template "
                     "under a chat template, so the answer-format instruction must be inside the question: prepare "
                     "the file with `cooper prompts`")

    placement = _rl_placement(env, arm, assistant_model=assistant not in (None, "policy"))
    n = env.int("N_SAMPLES", 16, minimum=2)
    rollout_batch = env.int("ROLLOUT_BATCH_SIZE", 128)
    train_batch = env.int("TRAIN_BATCH_SIZE", 512)
    micro = env.int("MICRO_BATCH_SIZE", 4)
    episodes = env.int("NUM_EPISODES", 15)
    rollout_micro = env.int("ROLLOUT_MICRO_BATCH_SIZE", 16)
    check_batch_sizes(env, placement, n, rollout_batch, rollout_micro, train_batch, micro)
    if verify_rm:  # after the cheap checks: reading a model config imports torch and transformers (seconds)
        check_verify_rm(env, verify_rm)
    warmup = _warmup_ratio(env, len(rows), n, rollout_batch, train_batch, episodes)
    for name, default in (("SIGNAL_MARGIN", 600), ("SAVE_ON_SIGNAL_S", None), ("SAVE_RESERVE", 120)):
        env.int(name, default, minimum=0)  # the job's USR1 handler does arithmetic with them (common.sh)
    job = env.get("SLURM_JOB_ID", "dryrun")
    if cpu_mode(env):  # the CPU runtime's routes (docs/cluster.md): gloo weight sync, eager attention, dtype auto
        device_flags = ["--vllm.sync_backend", "gloo", "--vllm.enforce_eager", "--ds.attn_implementation", "eager"]
    else:
        device_flags = ["--vllm.sync_backend", "nccl", "--ds.param_dtype", "bf16",
                        "--ds.attn_implementation", "flash_attention_2"]
    eval_flags = _eval_flags(env, input_key, label_key)
    max_samples = env.int("MAX_SAMPLES", None)
    shared = [
        "--actor.model_name_or_path", policy,
        "--data.prompt_dataset", prompts, "--data.input_key", input_key, "--data.label_key", label_key,
        "--data.apply_chat_template",
        "--data.max_len", str(env.int("MAX_LEN", 1024)), "--rollout.max_new_tokens", str(env.int("MAX_NEW_TOKENS", 512)),
        "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", str(n),
        "--rollout.temperature", str(env.float("TEMPERATURE", 1.0)), "--rollout.top_p", "1.0",
        "--rollout.batch_size", str(rollout_batch), "--rollout.micro_batch_size", str(rollout_micro),
        "--train.batch_size", str(train_batch), "--train.micro_batch_size", str(micro),
        "--train.max_epochs", "1", "--train.num_episodes", str(episodes),
        "--algo.kl.use_loss", "--algo.kl.estimator", "k3", "--algo.kl.init_coef", str(env.float("KL_COEF", 0.001)),
        "--actor.adam.lr", str(env.float("ACTOR_LR", 1e-6)), "--actor.lr_scheduler", "constant_with_warmup",
        "--actor.lr_warmup_ratio", repr(warmup),
        *placement.openrlhf_flags(),
        *_colocation_flags(env, placement),
        "--vllm.gpu_memory_utilization", str(env.float("VLLM_GPU_MEMORY_UTILIZATION", 0.5 if placement.colocate_all else 0.8)),
        *device_flags,
        "--ds.zero_stage", "2", "--actor.gradient_checkpointing_enable",
        "--cooper.verifier_workers", str(env.int("VERIFIER_WORKERS", 16)), "--cooper.verifier_deadline_s", "10",
        "--train.seed", str(env.int("SEED", 42, minimum=0)),
        # A requeued or resubmitted job (time limit, preemption) continues from the newest whole checkpoint: the
        # one saved on the time-limit signal (ray/save_request.py), else the last periodic one.
        "--ckpt.save_steps", str(env.int("SAVE_STEPS", 20)), "--ckpt.load_enable",
        "--ckpt.path", os.path.join(out, "ckpt"), "--ckpt.output_dir", os.path.join(out, "final"),
        "--logger.tensorboard_dir", os.path.join(out, "tensorboard"), "--logger.wandb.run_name", f"cooper-{arm}-{job}",
        "--cooper.sample_log_dir", os.path.join(out, "samples"),
        *eval_flags, *(["--data.max_samples", str(max_samples)] if max_samples else []),
    ]
    rm_training = [
        "--cooper.rm_lr", str(env.float("RM_LR", 1e-5)), "--cooper.rm_weight_decay", "0.01",
        "--cooper.rm_lr_scheduler", "constant_with_warmup", "--cooper.rm_warmup_ratio", "0.01",
        "--cooper.rm_micro_batch_size", "4", "--cooper.negative_max_new_tokens", str(env.int("MAX_NEW_TOKENS", 512)),
    ] if ARMS[arm].trains_rm else []
    argv = train_cooper_argv(arm, [*shared, *wandb_flags(env)], rm=verify_rm, negative_source=negative_source,
                             rm_training=rm_training, assistant_model=assistant if assistant != "policy" else None,
                             python="python")
    argv += list(extra_args)
    notes += secret_flag_notes(extra_args)
    entry.check_train_cooper(argv[3:], 0 if cpu_mode(env) else placement.gpus_per_node)
    resumes, point = check_resumable(out, argv)
    if resumes:
        notes.append(f"OUT={out}: the job resumes from {' and '.join(resumes)}")
    if point is not None and point.cut:
        notes.append(f"OUT={out}: {point.describe()}")
    # The job's runtime env comes from the one place that builds it; train_cooper's ray.init adds only what is
    # missing from it (runtime/ray_env.py says why). CPU mode: the CPU runtime in every worker, a small KV cache.
    # Imported here: it imports torch, which the other stages' checks and each attempt's launch.json do without.
    from cooper_openrlhf.runtime.ray_env import cooper_runtime_env

    launcher_defaults = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                         **({"VLLM_CPU_KVCACHE_SPACE": "1"} if cpu_mode(env) else {})}
    runtime_env = cooper_runtime_env({**launcher_defaults, **{k: v for k, v in env.values.items() if v != ""}},
                                     on_cpu=cpu_mode(env))
    return Plan("rl", [argv], notes, placement, runtime_env)


def wandb_flags(env: Env) -> list[str]:
    """Weights & Biases on when WANDB_API_KEY is set, as wandb itself reads it: the key stays in the environment
    (which the job and every Ray node inherit), never on a command line, in a log or in launch.json."""
    return ["--logger.wandb.key", WANDB_KEY_FROM_ENV] if env.get("WANDB_API_KEY") else []


def secret_flag_notes(extra_args) -> list[str]:
    given = [flag for flag in SECRET_FLAGS if any(word.split("=", 1)[0] == flag for word in extra_args)]
    return [f"{flag} on the command line is visible to `ps` and in Ray's job list (the records here show it as "
            f"***); export WANDB_API_KEY instead and drop the flag" for flag in given]


def _colocation_flags(env: Env, placement: Placement) -> list[str]:
    """COLOCATE_ALL=1 on GPUs: vLLM's and DeepSpeed's sleep modes, without which one GPU holds the resident engine,
    the actor's states, the reference's peak and the RM at once (docs/cluster.md's memory table: well over 80 GB for
    the paper's configuration). CPU mode needs neither (and vLLM-CPU has no sleep mode)."""
    if not placement.colocate_all or cpu_mode(env):
        return []
    return ["--vllm.enable_sleep", "--ds.enable_sleep"]


def _eval_flags(env: Env, input_key: str, label_key: str) -> list[str]:
    """Held-out evaluation every EVAL_STEPS rollout steps on EVAL_PROMPTS (`cluster.prompts --heldout`'s split)."""
    eval_prompts = env.get("EVAL_PROMPTS")
    if eval_prompts is None:
        return []
    if not env.is_pending(eval_prompts):
        rows = read_rows("EVAL_PROMPTS", eval_prompts)
        check_rows_have_keys("EVAL_PROMPTS", eval_prompts, rows, {input_key: "INPUT_KEY", label_key: "LABEL_KEY"})
    return ["--eval.dataset", eval_prompts, "--eval.steps", str(env.int("EVAL_STEPS", 10)),
            "--eval.n_samples_per_prompt", str(env.int("EVAL_N_SAMPLES", 1))]


# --------------------------------------------------------------------------------- VerifyRM stages


def plan_annotate(env: Env, extra_args: list[str] = (), *, entry: EntryPoints) -> Plan:
    """Split PROMPTS into SHARDS files (once; the same files on every re-submission) and one annotate per shard."""
    from cooper_openrlhf.rm.data import PROMPT_FORMATS, RecipeDataError, load_prompts

    prompts = env.require("PROMPTS", "questions with reference answers (JSON Lines)")
    generators = [g for g in env.require("GENERATORS", "comma-separated generator model folders").split(",") if g]
    judge = env.require("JUDGE", "the LLM judge's model folder (the paper: Qwen3-4B)")
    out = env.require("OUT", "the annotation folder (shards/, annotated/)")
    fmt = env.choice("FORMAT", "auto", PROMPT_FORMATS)
    shards = env.int("SHARDS", 8)
    tp = env.int("GPUS_PER_TASK", 1)
    for index, generator in enumerate(generators):
        check_model_dir(env, f"GENERATORS (item {index + 1})", generator)
    check_model_dir(env, "JUDGE", judge)
    if not os.path.isfile(prompts):
        raise PreflightError(f"PROMPTS={prompts}: data file does not exist")
    try:
        problems = load_prompts(prompts, fmt)
    except RecipeDataError as exc:
        raise PreflightError(f"PROMPTS={prompts} (FORMAT={fmt}): {exc}") from None
    if shards > len(problems):
        raise PreflightError(f"SHARDS={shards}: more shards than the {len(problems)} prompts; set SHARDS to at most "
                             f"{len(problems)}, and the same SHARDS for verifyrm_train.sbatch (it reads the shards)")
    check_writable_dir("OUT", out)
    shard_files, part_files = shard_paths(out, shards)
    os.makedirs(os.path.dirname(shard_files[0]), exist_ok=True)
    os.makedirs(os.path.dirname(part_files[0]), exist_ok=True)
    commands = []
    for k, (start, end) in enumerate(shard_bounds(len(problems), shards)):
        text = "".join(json.dumps({"question": p.question, "reference": p.reference}) + "\n" for p in problems[start:end])
        if os.path.exists(shard_files[k]):
            with open(shard_files[k], encoding="utf-8") as handle:
                if handle.read() != text:
                    raise PreflightError(f"OUT={out}: {shard_files[k]} holds other prompts than PROMPTS={prompts} now "
                                         "gives; a resumed annotation must see the same prompts: use a new OUT")
        else:  # whole or absent: array tasks of a plain `sbatch` write the shards at once
            with open(f"{shard_files[k]}.{os.getpid()}.tmp", "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(handle.name, shard_files[k])
        argv = ["python", "-m", "cooper_openrlhf.cli.verifyrm", "annotate", "--prompts", shard_files[k],
                "--out", part_files[k], *[a for g in generators for a in ("--generator", g)], "--judge", judge,
                *(["--engine", "hf"] if cpu_mode(env) else ["--engine", "vllm", "--engine-option", f"tensor_parallel_size={tp}"]),
                "--samples-per-question", str(env.int("SAMPLES_PER_QUESTION", 4)),
                "--max-new-tokens", str(env.int("GEN_MAX_NEW_TOKENS", 1024)),
                "--verifier-workers", str(env.int("ANNOTATE_VERIFIER_WORKERS", 4)), *extra_args]
        parsed = parse_or_fail("verifyrm annotate flags", lambda: entry.verifyrm_parser().parse_known_args(argv[3:]))
        if parsed[1]:
            raise PreflightError(f"verifyrm annotate flags: unrecognized arguments: {' '.join(parsed[1])}")
        commands.append(argv)
    return Plan("annotate", commands, [f"{len(problems)} prompts in {shards} shards under {out}/shards"])


def plan_verifyrm_train(env: Env, extra_args: list[str] = (), *, entry: EntryPoints) -> Plan:
    """deepspeed over the node's GPUs running `verifyrm train` (official recipe's lr, decay, epochs, batch)."""
    pretrain = env.require("PRETRAIN", "the VerifyRM backbone folder (the paper: Qwen2.5-Math-1.5B-Instruct)")
    out = env.require("OUT", "the VerifyRM run folder (best/ is the export the RL arms read)")
    data = env.get("DATA")
    notes = []
    if data is None:
        annotated = env.require("ANNOTATED", "the annotate folder whose shards are merged (or set DATA to a file)")
        data = os.path.join(out, "verifyrm_data.jsonl")
        shards = env.int("SHARDS", 8)  # the job's merge step reads the same variable
        if not env.is_pending(annotated):
            if not os.path.isdir(annotated):
                raise PreflightError(f"ANNOTATED={annotated}: folder does not exist")
            notes += check_annotated(annotated, shards)
    elif not env.is_pending(data):
        from cooper_openrlhf.rm.data import RecipeDataError, load_labelled

        if not os.path.isfile(data):
            raise PreflightError(f"DATA={data}: data file does not exist")
        try:
            load_labelled(data)
        except RecipeDataError as exc:
            raise PreflightError(f"DATA={data}: {exc}") from None
    check_model_dir(env, "PRETRAIN", pretrain)
    check_writable_dir("OUT", out)
    cpu = cpu_mode(env)
    # CPU mode: CPU_RANKS processes under torch.distributed.run (DeepSpeed's CPU accelerator), eager attention.
    gpus = env.int("CPU_RANKS", 1) if cpu else env.int("GPUS", env.int("SLURM_GPUS_ON_NODE", 8))
    # RM_-prefixed: reproduce_paper.sh passes one environment to every stage, and the RL arms have their own.
    batch, micro = env.int("RM_TRAIN_BATCH_SIZE", 16384), env.int("RM_MICRO_BATCH_SIZE", 4)
    if batch % (micro * gpus):
        raise PreflightError(f"RM_TRAIN_BATCH_SIZE={batch}: must be a multiple of RM_MICRO_BATCH_SIZE={micro} x GPUS={gpus}")
    launcher = (["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus)] if cpu else
                ["deepspeed", "--num_gpus", str(gpus)])
    argv = [*launcher, "--module" if not cpu else "-m", "cooper_openrlhf.cli.verifyrm", "train",
            # train_rm's flag names (the old ones print a deprecation line each), so a user's extra flag of the same
            # setting overrides the launcher's: argparse keeps the last.
            "--model.model_name_or_path", pretrain, *(["--init-head"] if env.flag("INIT_HEAD") else []),
            "--data.dataset", data, "--ckpt.output_dir", out, "--train.max_epochs", str(env.int("EPOCHS", 3)),
            "--adam.lr", str(env.float("LR", 2e-5)), "--lr_scheduler", "linear", "--lr_warmup_ratio", "0",
            "--adam.weight_decay", "0.01", "--data.max_len", str(env.int("MAX_LENGTH", 2048)),
            "--ds.zero_stage", "2",
            *(["--ds.attn_implementation", "eager"] if cpu else
              ["--ds.param_dtype", "bf16", "--ds.attn_implementation", "flash_attention_2"]),
            "--train.batch_size", str(batch), "--train.micro_batch_size", str(micro), *wandb_flags(env), *extra_args]
    train_at = argv.index("train")
    args, unknown = parse_or_fail("verifyrm train flags", lambda: entry.verifyrm_parser().parse_known_args(argv[train_at:]))
    strays = [a for a in unknown if a.startswith("--") and not a.startswith(("--ds.", "--train."))]
    if strays:
        raise PreflightError(f"verifyrm train flags: unrecognized arguments: {' '.join(strays)}")
    from cooper_openrlhf.runtime.openrlhf_args import parse_openrlhf_args
    from cooper_openrlhf.runtime import install_cpu_runtime

    install_cpu_runtime()
    parse_or_fail("verifyrm train's OpenRLHF flags (--ds.*, --train.*)", lambda: parse_openrlhf_args(unknown))
    return Plan("verifyrm-train", [argv], notes)


# ---------------------------------------------------------------------------------------- evaluate

# The repository's speed scripts (benchmarks/ beside the package): a natural but wrong DATA_DIR when run in the checkout.
CHECKOUT_BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                   "benchmarks")


def checkpoint_list(env: Env) -> list[str]:
    """CHECKPOINTS: a file with one model folder per line, or a comma-separated list."""
    text = env.require("CHECKPOINTS", "model folders to evaluate: a file (one per line) or a comma-separated list")
    if os.path.isfile(text):
        with open(text, encoding="utf-8") as handle:
            items = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
    else:
        items = [item for item in text.split(",") if item]
    if not items:
        raise PreflightError(f"CHECKPOINTS={text}: no checkpoint listed")
    return items


def result_name(index: int, path: str) -> str:
    """A folder name for one checkpoint's results: its index and the last two path parts."""
    tail = "-".join(os.path.normpath(path).split(os.sep)[-2:])
    return f"{index:02d}-" + re.sub(r"[^\w.-]+", "_", tail)


def plan_evaluate(env: Env, extra_args: list[str] = (), *, entry: EntryPoints) -> Plan:
    """One `cli.evaluate` per checkpoint (an array task each)."""
    parser = entry.evaluate_parser()
    checkpoints = checkpoint_list(env)
    data_dir = env.require("DATA_DIR", "the folder of benchmark files (<name>/test.jsonl)")
    out = env.require("OUT", "the evaluation folder (one sub-folder per checkpoint)")
    benchmarks = env.get("BENCHMARKS", DEFAULT_BENCHMARKS)
    if not os.path.isdir(data_dir):
        raise PreflightError(f"DATA_DIR={data_dir}: folder does not exist")
    if os.path.realpath(data_dir) == os.path.realpath(CHECKOUT_BENCHMARKS):  # the name invites it; it holds no data
        raise PreflightError(f"DATA_DIR={data_dir}: that is this checkout's own benchmarks/ folder (speed "
                             "measurements), not benchmark data; put the files in another folder (e.g. "
                             "my_benchmarks/gsm8k/test.jsonl) and pass that")
    for index, path in enumerate(checkpoints):
        check_model_dir(env, f"CHECKPOINTS (item {index + 1})", path)
    check_writable_dir("OUT", out)
    try:
        from cooper_openrlhf.eval.datasets import parse_benchmark_specs

        parse_benchmark_specs(benchmarks, data_dir)
    except ImportError:
        pass
    except Exception as exc:  # the evaluate CLI's own spec errors (names the benchmark and file)
        raise PreflightError(f"BENCHMARKS={benchmarks} / DATA_DIR={data_dir}: {exc}") from None
    commands = []
    for index, path in enumerate(checkpoints):
        argv = ["python", "-m", "cooper_openrlhf.cli.evaluate", "--model", path, "--benchmarks", benchmarks,
                "--data-dir", data_dir, "--out", os.path.join(out, result_name(index, path)),
                "--engine", env.choice("ENGINE", "hf" if cpu_mode(env) else "vllm", ("vllm", "hf")),
                "--protocol", env.choice("PROTOCOL", "paper", ("paper", "greedy"))]
        limit = env.int("LIMIT", None)
        argv += ["--limit", str(limit)] if limit else []
        argv += list(extra_args)
        parse_or_fail("evaluate flags", lambda: parser.parse_args(argv[3:]))
        commands.append(argv)
    return Plan("evaluate", commands)


# ------------------------------------------------------------------------------------------ report


def plan_report(env: Env, extra_args: list[str] = (), *, entry: EntryPoints | None = None) -> Plan:
    """`cli.report` over the arms' run folders (RUN_DIRS, comma-separated): figures, report.md, summary.json in OUT."""
    runs = [r for r in env.require("RUN_DIRS", "the arms' run folders (comma-separated OUT of each RL job)").split(",") if r]
    out = env.require("OUT", "the report folder (figures, report.md, summary.json)")
    for index, run in enumerate(runs):
        if not env.is_pending(run) and not os.path.isdir(run):
            raise PreflightError(f"RUN_DIRS (item {index + 1})={run}: run folder does not exist")
    check_writable_dir("OUT", out)
    return Plan("report", [["python", "-m", "cooper_openrlhf.cli.report", *runs, "--out", out, *extra_args]])


STAGES = Registry("stage", {"rl": plan_rl, "annotate": plan_annotate, "verifyrm-train": plan_verifyrm_train,
                            "evaluate": plan_evaluate, "report": plan_report}, error=PreflightError)


def plan_stage(stage: str, env: Env, extra_args: list[str] = (), *, entry: EntryPoints) -> Plan:
    return STAGES[stage](env, list(extra_args), entry=entry)
