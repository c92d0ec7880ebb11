"""The RL stage's plan: one arm's train_cooper command on N nodes, its GPU placement and its Ray runtime env.

`plan_rl(env)` turns the RL launcher's variables into the train_cooper argv (through `cluster.arms.train_cooper_argv`,
every flag parsed by train_cooper itself), the placement of its roles (`cluster/placement.py`: `rl_placement`, which
the job script also reads for Ray's slots per node), the warm-up ratio, and the runtime env the job is submitted with;
a run folder's checkpoints are checked against the command that wrote them (`cluster/launch_record.py`).

The defaults are the official Cooper recipe's (ZJU-REAL/Cooper `recipe/cooper/`) where the paper is silent;
docs/cluster.md lists every value, its source, and where this package departs.
"""

import os

from cooper_openrlhf.algo.registry import NEGATIVE_SOURCES
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
from cooper_openrlhf.cluster.placement import Placement, PlacementError, plan_placement
from cooper_openrlhf.cluster.plan import EntryPoints, Plan, wandb_flags
from cooper_openrlhf.runtime.secrets import SECRET_FLAGS


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
