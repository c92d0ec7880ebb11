"""Train a policy with Cooper: OpenRLHF 0.11.2's `train_ppo_ray` with Cooper's step.

    cooper train [OpenRLHF flags] [--remote_rm_trainable] [--cooper.* flags]
    # = python -m cooper_openrlhf.cli.train_cooper ...

Every stock flag works unchanged, plus `--remote_rm_trainable` and `--cooper.*` (`cli/cooper_args.py`).
The three arms of the paper run from this one command: Cooper (`--remote_rm_trainable`), static RM
(without it) and rule reward (`--cooper.reward_source rule`).

Parsing reuses OpenRLHF's own parser AND its validation block, which live inline under
`if __name__ == "__main__":` in `openrlhf/cli/train_ppo_ray.py`, through the one interception point of
`runtime/openrlhf_args.py`: Cooper's flags are added there and checked before the stock block validates (and
normalises) the args; `--ds.param_dtype` defaults to `auto` and is resolved there. Nothing of the block is copied.

`train_cooper(args)` is stock `train(args)` (openrlhf/cli/train_ppo_ray.py:19-180) with these
differences, each marked "Cooper:" below:
  1. start-up checks, before Ray starts: every model path is a model folder (or a hub id the hub or its cache can
     serve); every prompt row has a reference that math-verify parses as a final answer (up to
     --cooper.max_unparseable_reference_share of the rows may fail); the RM path is a one-logit sequence classifier.
     A mistake found there, or by the flag checks, is one `error:` line and exit status 2, as in the other CLIs
     (tracebacks are for bugs); the args are printed with their secrets redacted (`runtime.secrets`); with
     --ckpt.load_enable both models' `latest` files point at the newest step both saved whole; a save request
     (`ray/save_request.py`) left by an earlier attempt is removed;
  2. Ray: with RAY_ADDRESS set, stock's `ray.init` joins that cluster (whatever the driver has); else, on a
     machine without CUDA, `runtime.ray_cluster.init_local_ray()` (logical over-commit + CPU shims);
  3. the reward group is `TrainableRewardModelActor` (stock: `RewardModelActor`), initialised with the run's
     rollout steps and `--cooper.*`; there is none for the rule arm without an RM; there is no critic (Cooper
     rejects gae);
  4. a `PairConstructionActor` (verifier pool + assistant) and `CooperTrainer` (stock: `PPOTrainer`);
  5. at the end the trained RM is exported in the VerifyRM format and the pair actor is closed.
"""

import logging
import os
import re
import sys

import ray
from ray.util.placement_group import placement_group

from cooper_openrlhf.cli.cooper_args import COOPER_GROUP, add_cooper_args, validate_cooper_args
from cooper_openrlhf.cli.train_help import arrange_help
from cooper_openrlhf.runtime.openrlhf_args import validated_train_ppo_ray_args

logger = logging.getLogger("cooper_openrlhf.train_cooper")


# --------------------------------------------------------------------------------------- parsing
PROG = "cooper train"  # `python -m cooper_openrlhf.cli.train_cooper` runs the same command


def add_train_cooper_args(parser):
    """Cooper's flags on OpenRLHF's parser, which is named here; `--help` leads with Cooper's flags and shows
    defaults (`cli.train_help`): without it, it opens with ~390 stock flags."""
    parser.prog = PROG
    parser.usage = f"{PROG} [--remote_rm_trainable] [--cooper.* flags] [OpenRLHF train_ppo_ray flags]"
    parser.description = __doc__.split("\n\n")[0]
    return arrange_help(add_cooper_args(parser), COOPER_GROUP)


def parse_args(argv: list[str] | None = None, gpu_run: bool | None = None):
    """Stock parser + Cooper's flags, Cooper's checks, then stock validation -> hierarchized args.

    gpu_run: whether the run's models are on GPUs, for the dtype and the device checks (default: decided here,
    `runtime.openrlhf_args`); the launchers' preflight passes what the job's nodes have (GPUS_PER_NODE)."""
    # Cooper grades --eval.dataset with its rule verifier; the stock block asserts a remote RM for it.
    return validated_train_ppo_ray_args(argv, extend=add_train_cooper_args,
                                        check=lambda args: validate_cooper_args(args, cuda=gpu_run),
                                        hold_back=("eval.dataset",), gpu_run=gpu_run)


# ------------------------------------------------------------------------------ start-up checks
EXIT_BAD_INPUT = 2
REFERENCE_PARSE_TIMEOUT_S = 5
SHOWN_BAD_REFERENCES = 5


class StartupError(ValueError):
    """A mistake in the run's input found at start-up (a model folder, a prompt row): reported as one `error:` line."""


_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def check_model_folder(flag: str, path: str) -> None:
    """`path` is a model folder with config.json, or a hub id (ORG/NAME, no such folder here) that the hub can serve:
    online, transformers downloads it; offline (HF_HUB_OFFLINE=1, as the launchers run) only from the hub cache."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise StartupError(f"{flag} {path}: no config.json in the folder; not a Hugging Face model folder")
        return
    if os.path.exists(path):
        raise StartupError(f"{flag} {path}: a file, not a model folder")
    if _HUB_ID.fullmatch(path):
        from huggingface_hub import constants, try_to_load_from_cache

        if not constants.HF_HUB_OFFLINE or isinstance(try_to_load_from_cache(path, "config.json"), str):
            return
        raise StartupError(f"{flag} {path}: model folder does not exist, and as a hub id it is not in the hub cache "
                           "(HF_HUB_OFFLINE=1)")
    raise StartupError(f"{flag} {path}: model folder does not exist")


def check_model_folders(args) -> None:
    """Every model the run loads, before any actor starts (the policy's path serves the reference model too)."""
    check_model_folder("--actor.model_name_or_path", args.actor.model_name_or_path)
    if args.reward.model_name_or_path:
        check_model_folder("--reward.model_name_or_path", args.reward.model_name_or_path)
    if args.cooper.assistant == "model" and args.cooper.assistant_model_path:
        check_model_folder("--cooper.assistant_model_path", args.cooper.assistant_model_path)


def check_prompt_files(args) -> None:
    """Each --data.prompt_dataset that names a local file exists (else `datasets` would look it up on the hub)."""
    for spec in filter(None, (part.strip() for part in args.data.prompt_dataset.split(","))):
        local = os.path.isabs(spec) or spec.startswith(".") or spec.endswith((".json", ".jsonl", ".parquet", ".csv"))
        if local and not os.path.exists(spec):
            raise StartupError(f"--data.prompt_dataset {spec}: data file does not exist")


def reference_problem(reference: str) -> str | None:
    """Why `reference` cannot serve as the gold answer of the rule verifier, or None when it can.

    Parsed as verify/rule.py parses gold: math-verify's `parse` of `\\boxed{normalized reference}` (main thread:
    math-verify's timeout is a signal alarm). A worked solution with a marked final answer (a raw GSM8K label,
    "... #### 72") is refused too: math-verify would read some number of it, and the RM would see the solution.
    """
    from math_verify import parse
    from math_verify.errors import TimeoutException

    from cooper_openrlhf.verify.extract import extract_answer, normalize_answer

    normalized = normalize_answer(reference)
    if normalized is None:
        return "empty"
    marked = extract_answer(reference, fallback="none")
    if marked is not None and normalized != normalize_answer(marked) and normalized != f"\\boxed{{{marked}}}":
        return f"a worked solution, not a final answer (its marked final answer is {marked!r}: store that)"
    try:
        parsed = parse(f"\\boxed{{{normalized}}}", parsing_timeout=REFERENCE_PARSE_TIMEOUT_S, raise_on_error=True)
    except TimeoutException:
        return f"math-verify took over {REFERENCE_PARSE_TIMEOUT_S} s to parse it"
    except Exception as exc:  # math-verify's parser raising on this text is what is being checked
        return f"math-verify cannot parse it ({type(exc).__name__}: {exc})"
    return None if parsed else "math-verify parses nothing from it"


def check_prompt_dataset(args, strategy) -> None:
    """Every row of every --data.prompt_dataset has a question and a reference math-verify parses as a final answer.

    Errors name the file, row, field and value. Up to --cooper.max_unparseable_reference_share of all rows may have
    an unparseable reference (logged; those prompts never give a positive); more stops the run.
    """
    from openrlhf.datasets.utils import blending_datasets
    from tqdm import tqdm

    from cooper_openrlhf.ray.step_records import raw_question

    input_key, label_key = args.data.input_key, args.data.label_key
    bad, total = [], 0  # bad: "where: problem" lines
    for spec in args.data.prompt_dataset.split(","):
        spec = spec.strip()
        data = blending_datasets(spec, None, strategy, args.train.seed, max_count=args.data.max_samples,
                                 dataset_split=args.data.prompt_split)
        for row_index, row in enumerate(tqdm(data, desc=f"checking references of {spec}", disable=len(data) < 1000)):
            where = f"prompt dataset {spec}, row {row_index} (0-based)"
            total += 1
            if input_key not in row:
                raise StartupError(f"{where}: no field {input_key!r} (--data.input_key); fields present: {sorted(row)}")
            try:
                raw_question(row, input_key)
            except ValueError as exc:
                raise StartupError(f"{where}: {exc}") from None
            reference = row.get(label_key)
            problem = "missing" if reference is None else reference_problem(str(reference))
            if problem is not None:
                bad.append(f"{where}, field {label_key!r} (--data.label_key) = {str(reference)[:120]!r}: {problem}")
    if not bad:
        return
    share, allowed = len(bad) / total, args.cooper.max_unparseable_reference_share
    shown = "\n  ".join(bad[:SHOWN_BAD_REFERENCES])
    if share > allowed:
        raise StartupError(
            f"{len(bad)} of {total} prompt rows ({share:.1%}) have no reference the rule verifier can use, more than "
            f"--cooper.max_unparseable_reference_share {allowed}; Cooper verifies every rollout against it. "
            f"Fix or drop the rows. First ones:\n  {shown}")
    logger.warning("%d of %d prompt rows (%.1f%%) have an unusable reference (within "
                   "--cooper.max_unparseable_reference_share %s); they give no positives. First ones:\n  %s",
                   len(bad), total, 100 * share, allowed, shown)


def check_reward_model(path: str) -> None:
    """Raise `rm.model.NotASequenceClassifierError` unless `path` holds a one-logit sequence classifier.

    Reads only the config (the weights load later, in the RM actors), with the same rules as `rm.model.load_rm`.
    """
    from cooper_openrlhf.rm import model as rm_model

    rm_model.check_reward_model(path)


# ----------------------------------------------------------------------------------------- wiring
def start_ray() -> None:
    """Cooper: stock's `ray.init` where a cluster is named (RAY_ADDRESS; OpenRLHF 0.11.2 has no address flag) or
    CUDA exists; a local cluster with the CPU runtime otherwise.

    The address comes first: the driver of a GPU cluster may be a CPU-only head node, whose own missing CUDA
    says nothing about where the actors run (and `ray.init(num_cpus=...)` is refused when joining a cluster).
    A joined cluster is a CPU one when the submitted job says so (the launchers' CPU mode sets the CPU runtime in
    the job's env). The runtime env is `runtime.ray_env`'s, less what the submitted job already set: Ray refuses
    a driver env that repeats a job's field or variable."""
    from cooper_openrlhf.runtime import cpu, cuda_available
    from cooper_openrlhf.runtime.ray_cluster import init_local_ray, ray_cluster_address
    from cooper_openrlhf.runtime.ray_env import check_workers_can_import, driver_runtime_env, submitted_job_runtime_env

    if ray.is_initialized():
        return
    check_workers_can_import()
    if ray_cluster_address() is None and not cuda_available():
        init_local_ray()
        return
    job_env = (submitted_job_runtime_env() or {}).get("env_vars") or {}
    ray.init(runtime_env=driver_runtime_env(on_cpu=job_env.get(cpu.CPU_RUNTIME_ENV) == "1"))


def model_group(role, actor_class, pg, args):
    """One `RayActorGroup` the way stock `train()` builds each of its model groups."""
    from openrlhf.trainer.ray.launcher import RayActorGroup

    return RayActorGroup(role.num_nodes, role.num_gpus_per_node, actor_class, pg=pg,
                         num_gpus_per_actor=0.2 if pg else 1,
                         duplicate_actors=args.ds.ring_attn_size * args.ds.tensor_parallel_size)


def pair_construction_actor(args, vllm_engines):
    """Cooper: the verifier pool and the assistant (the policy's engines, or a dedicated one)."""
    from cooper_openrlhf.algo.negatives import NegativeConfig
    from cooper_openrlhf.ray.pair_actor import PairConstructionActor

    cooper = args.cooper
    config = NegativeConfig(retries=cooper.negative_retries, max_new_tokens=cooper.negative_max_new_tokens,
                            temperature=cooper.negative_temperature, seed=args.train.seed,
                            answer_fallback=cooper.negative_answer_fallback, validity=cooper.negative_validity)
    own_engine = cooper.assistant == "model"
    return PairConstructionActor.remote(
        config,
        None if own_engine else vllm_engines,
        cooper.assistant_model_path if own_engine else args.actor.model_name_or_path,
        verifier_workers=cooper.verifier_workers,
        verifier_deadline_s=cooper.verifier_deadline_s,
        assistant_model_path=cooper.assistant_model_path if own_engine else None,
        assistant_max_model_len=None if own_engine else args.data.max_len,
        answer_fallback=cooper.answer_fallback,
    )


def rm_export_path(args) -> str:
    return args.cooper.rm_save_path or os.path.join(args.ckpt.output_dir, "rm")


def settle_resume_point(ckpt_path: str) -> None:
    """Before any model loads: point the policy's and the RM's `latest` at the newest step both saved whole
    (`ray/checkpoint_tags.py`; the policy actor loads what its `latest` names), and say in one line where the run
    resumes and which save was cut. Raises NoWholeCheckpoint when checkpoints exist but no step of them is whole."""
    from cooper_openrlhf.ray.checkpoint_tags import point_latest_at, resume_point

    point = resume_point(ckpt_path)
    if point.policy_tag is not None:
        point_latest_at(ckpt_path, point)
        logger.info("%s", point.describe())


def clear_save_requests(ckpt_path: str) -> None:
    """A save request (`ray/save_request.py`) left by an earlier attempt is stale: it would checkpoint this
    attempt's first step for nothing, and an old answer could pass for the answer to a new request."""
    from cooper_openrlhf.ray.save_request import clear_requests

    for path in clear_requests(ckpt_path):
        logger.info("removed %s, left by an earlier attempt", path)


def train_cooper(args) -> None:
    """Run a Cooper (or static-RM, or rule-reward) training; the diff to stock `train(args)` is in the module docstring."""
    from openrlhf.trainer.ray import create_vllm_engines
    from openrlhf.trainer.ray.launcher import ReferenceModelActor
    from openrlhf.trainer.ray.ppo_actor import PolicyModelActor
    from openrlhf.utils import get_strategy

    from cooper_openrlhf.ray.reward_actor import TrainableRewardModelActor
    from cooper_openrlhf.ray.trainer import CooperTrainer
    from cooper_openrlhf.runtime.secrets import redact_namespace

    strategy = get_strategy(args)
    # Cooper: the args first, so that a log whose run stops at a check below still says what was asked; secrets
    # redacted (job logs are shared). Then bad input fails here, before Ray or any actor starts.
    strategy.print(redact_namespace(args, os.environ))
    check_model_folders(args)
    check_prompt_files(args)
    if args.reward.model_name_or_path:
        check_reward_model(args.reward.model_name_or_path)
    check_prompt_dataset(args, strategy)
    if args.ckpt.load_enable:
        settle_resume_point(args.ckpt.path)
    clear_save_requests(args.ckpt.path)
    start_ray()

    # As stock: one placement group for colocated actor/ref (and, with colocate_all, vLLM and the RM).
    actor_gpus = args.actor.num_nodes * args.actor.num_gpus_per_node
    pg = None
    if args.train.colocate_actor_ref or args.train.colocate_all:
        if args.algo.kl.init_coef > 0:
            assert (args.actor.num_nodes, args.actor.num_gpus_per_node) == (args.ref.num_nodes, args.ref.num_gpus_per_node), \
                "num_nodes and num_gpus_per_node must be the same when colocate actor and ref model."
        bundles = [{"GPU": 1, "CPU": 1} for _ in range(actor_gpus)]
        pg = placement_group(bundles, strategy="PACK")
        ray.get(pg.ready())
    shared_pg = pg if args.train.colocate_all else None
    if shared_pg is not None:
        assert actor_gpus == args.vllm.num_engines * args.vllm.tensor_parallel_size, \
            "actor_num_nodes * actor_num_gpus_per_node must be equal to vllm_num_engines * vllm_tensor_parallel_size"
        # Cooper: the RM ranks take bundles of the same group.
        assert args.reward.num_nodes * args.reward.num_gpus_per_node <= actor_gpus, \
            "with --train.colocate_all the RM needs at most as many GPUs as the actor (it shares the actor's bundles)"
    vllm_engines = create_vllm_engines(
        args.vllm.num_engines, args.vllm.tensor_parallel_size, args.actor.model_name_or_path, args.train.seed,
        args.train.full_determinism_enable, args.vllm.enable_prefix_caching, args.vllm.enforce_eager,
        args.data.max_len, shared_pg, args.vllm.gpu_memory_utilization, args.vllm.enable_sleep,
        "processed_logprobs" if args.algo.advantage.is_correction_level != "off" else None,
        agent_func_path=None, remote_rm_url=None, max_images_per_prompt=getattr(args.data, "max_images_per_prompt", 0),
    )
    actor_model = model_group(args.actor, PolicyModelActor, pg, args)
    ref_model = model_group(args.ref, ReferenceModelActor, pg, args) if args.algo.kl.init_coef > 0 else None
    # Cooper: the trainable RM group (stock: RewardModelActor), and the pair-construction actor.
    reward_model = (model_group(args.reward, TrainableRewardModelActor, shared_pg, args)
                    if args.reward.model_name_or_path else None)
    pair_actor = pair_construction_actor(args, vllm_engines)

    trainer = CooperTrainer.remote(
        args.actor.model_name_or_path, strategy, actor_model, None, reward_model, ref_model, vllm_engines,
        pair_actor=pair_actor, do_sample=True, max_len=args.data.max_len,
        max_new_tokens=args.rollout.max_new_tokens, temperature=args.rollout.temperature, top_p=args.rollout.top_p,
    )
    max_steps = ray.get(trainer.get_max_steps.remote())
    refs = actor_model.async_init_model_from_pretrained(strategy, args.actor.model_name_or_path, max_steps, vllm_engines)
    if ref_model is not None:
        refs.extend(ref_model.async_init_model_from_pretrained(strategy, args.actor.model_name_or_path))
    if reward_model is not None:
        # Cooper: the RM's schedule spans rollout steps (max_steps counts the policy's optimizer steps).
        rollout_steps = ray.get(trainer.get_rollout_steps.remote())
        refs.extend(reward_model.async_init_model_from_pretrained(strategy, args.reward.model_name_or_path,
                                                                   rollout_steps, args.cooper))
    ray.get(refs)

    try:
        ray.get(trainer.fit.remote())
        ray.get(actor_model.async_save_model())
        if args.remote_rm_trainable:
            ray.get(reward_model.async_run_method(method_name="save_model", out_dir=rm_export_path(args)))
    except BaseException:
        close_after_failure(pair_actor)
        raise
    ray.get(pair_actor.close.remote())  # stops its verifier processes (and a dedicated assistant engine)
    report(args)


def close_after_failure(pair_actor) -> None:
    """Close the pair actor while an error propagates; a second error is logged, never raised over the first."""
    try:
        ray.get(pair_actor.close.remote(), timeout=60)
    except Exception:
        logger.exception("closing the pair-construction actor after the failure above also failed")


def report(args) -> None:
    """Where the run's outputs are (a CLI report, printed)."""
    lines = [f"policy: {os.path.abspath(args.ckpt.output_dir)}"]
    if args.remote_rm_trainable:
        lines.append(f"reward model (VerifyRM export): {os.path.abspath(rm_export_path(args))}")
    if args.ckpt.save_steps not in (-1, float("inf")):
        parts = "_actor, _rm" if args.remote_rm_trainable else "_actor"
        lines.append(f"checkpoints: {os.path.abspath(args.ckpt.path)} ({parts})")
    if args.logger.tensorboard_dir:
        lines.append(f"tensorboard logs: {os.path.abspath(os.path.join(args.logger.tensorboard_dir, args.logger.wandb.run_name))}")
    if args.logger.wandb.key:
        lines.append(f"wandb: project {args.logger.wandb.project}, run {args.logger.wandb.run_name}")
    if args.cooper.sample_log_dir:
        lines.append(f"rollouts and pairs: {os.path.abspath(args.cooper.sample_log_dir)}")
    print("Cooper run finished.\n  " + "\n  ".join(lines), flush=True)


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a mistake in the command or its inputs, not a bug: one `error:` line for them."""
    from cooper_openrlhf.cli.cooper_args import CooperArgsError
    from cooper_openrlhf.ray.checkpoint_tags import NoWholeCheckpoint
    from cooper_openrlhf.rm.model import NotASequenceClassifierError
    from cooper_openrlhf.runtime.dtype import DtypeError
    from cooper_openrlhf.runtime.ray_env import WorkersCannotImportError

    return (StartupError, CooperArgsError, NotASequenceClassifierError, DtypeError, WorkersCannotImportError,
            NoWholeCheckpoint)


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    from cooper_openrlhf.runtime import install_cpu_runtime
    from cooper_openrlhf.runtime.toolchain import ready_for_op_builds

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ready_for_op_builds()  # the local Ray it starts inherits its PATH
    install_cpu_runtime()  # before openrlhf.models is imported; a no-op with CUDA
    mistakes = user_errors()
    try:
        args = parse_args(argv)
    except AssertionError as exc:  # OpenRLHF's own validation block checks the flags with asserts
        return _error(f"OpenRLHF rejects the flags: {exc}")
    except mistakes as exc:
        return _error(str(exc))
    try:
        train_cooper(args)
    except mistakes as exc:
        return _error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
