"""What each launcher runs, built from its environment variables and checked before anything is submitted.

One function per stage turns the launcher's variables into the exact command(s) the job will run and checks
them: every flag through the entry point's own parser (`EntryPoints`: `train_cooper.parse_args`, which runs
OpenRLHF's own parser and validation; `verifyrm`'s parser; `evaluate`'s `build_parser()`; they live in cli/, a
layer above this one, and cli/launch_plans.py passes them in), the GPU placement (`cluster/placement.py`), model
folders, data rows, batch sizes and output folders (`cluster/checks.py`), and a run folder's checkpoints against the command
that wrote them (`cluster/launch_record.py`). `cli/preflight.py` is the shell's entry.

  plan_rl(env)              Cooper / static-RM / rule arm on N nodes: train_cooper argv + placement + Ray env
                            (cluster/rl_plan.py)
  plan_annotate(env)        VerifyRM annotation, one shard of the prompts per array task (resumable per shard)
  plan_verifyrm_train(env)  VerifyRM BCE training on the GPUs of one node under the deepspeed launcher
  plan_evaluate(env)        benchmark evaluation, one checkpoint per array task
  plan_report(env)          cli.report over the arms' run folders (the chain's last stage)

What a plan is and the parsers it passes through: `cluster/plan.py`. The RL defaults are the official Cooper
recipe's (ZJU-REAL/Cooper `recipe/cooper/`) where the paper is silent; docs/cluster.md lists every value, its source,
and where this package departs.
"""

import json
import os
import re

from cooper_openrlhf.cluster.annotation_shards import check_annotated, shard_bounds, shard_paths
from cooper_openrlhf.cluster.checks import (
    Env,
    PreflightError,
    check_model_dir,
    check_writable_dir,
    cpu_mode,
)
from cooper_openrlhf.cluster.plan import EntryPoints, Plan, parse_or_fail, wandb_flags
from cooper_openrlhf.cluster.rl_plan import plan_rl
from cooper_openrlhf.data.benchmarks import DEFAULT_BENCHMARKS
from cooper_openrlhf.runtime.registry import Registry


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
