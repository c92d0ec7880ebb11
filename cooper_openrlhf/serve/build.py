"""The reward service built from `cooper serve`'s flags (`cli/serve.py` parses and checks them, then starts it).

One place for what both hosts of the service are made of, so the one-process service and the replicated one
(`serve/replicated/`) read the flags alike:
- `service_config`: the `serve.service.ServiceConfig` of the flags;
- `served_scorer`, `build_learner`: the RM as scored without --learn (`RMScorer.load`), and the learner with its
  checkpointer (the RM on a DeepSpeed engine, the pairs' verifier and assistant, the RM guard);
- `build_splitter`: how prompts are split into questions (the policy's chat template);
- `side_inputs`: the held-out questions, the probe suite and the RM guard's anchors, read in the main thread;
- `build_service`, `one_process_server`: the one-process service (scorer, verifier lanes, learner, checkpointer,
  resumed from --state-dir) and the uvicorn server around its app.
"""

import logging
import os
from dataclasses import fields

logger = logging.getLogger("cooper_openrlhf.serve")  # `cli.serve`'s: the log lines keep their name

OWN_FILES = 1024  # the process's own descriptors beside its sockets: model files, verifier pipes, logs, checkpoints


def build_splitter(args):
    """The `serve.protocol.PromptSplitter` of the flags: the policy's chat template, or --no-chat-template's
    --input-template (with the policy's special tokens when --policy is given)."""
    from cooper_openrlhf.serve.protocol import PromptSplitter

    if args.no_chat_template:
        special = ()
        if args.policy:
            from transformers import AutoTokenizer

            special = AutoTokenizer.from_pretrained(args.policy).all_special_tokens
        return PromptSplitter(None, args.input_template, special)
    from transformers import AutoTokenizer

    return PromptSplitter.from_tokenizer(AutoTokenizer.from_pretrained(args.policy))


def service_config(args):
    """The `serve.service.ServiceConfig` of the flags (one process and the replicated service alike)."""
    from cooper_openrlhf.algo.hacking import HackingMonitorConfig
    from cooper_openrlhf.serve.service import ServiceConfig

    return ServiceConfig(mode=args.mode, group_size=args.group_size, groups_per_update=args.groups_per_update,
                         group_timeout_s=args.group_timeout_s, stale_after_s=args.stale_after_s,
                         partial_step_after_s=args.partial_step_after_s, retry_record=args.retry_record,
                         update_wait_timeout_s=args.update_wait_timeout_s, max_batch=args.max_batch,
                         max_wait_s=args.max_wait_ms / 1000,
                         wait_for_update=not args.no_wait_for_update, checkpoint_every=args.checkpoint_every,
                         on_hacking=args.on_hacking, check_groups=not args.no_group_check,
                         heldout=getattr(args, "heldout_questions", frozenset()),
                         monitor=HackingMonitorConfig(**{f.name: getattr(args, f"hacking_{f.name}")
                                                         for f in fields(HackingMonitorConfig)}))


def verifier_config(args):
    """The rule verifier's config: answers found as the trainer's pair actor finds them (`--answer-fallback`; the
    verifier's own default, last_number, would mark correct what the trainer calls answerless)."""
    from cooper_openrlhf.verify.rule import RuleVerifierConfig

    return RuleVerifierConfig(answer_fallback=args.answer_fallback)


def served_scorer(args):
    """An `rm.scorer.RMScorer` of `--rm` as a service without --learn serves it (the flags' dtype, length and
    batch), version 0: the one-process service's, and each scoring replica's of the replicated one."""
    from cooper_openrlhf.rm.scorer import RMScorer
    from cooper_openrlhf.runtime.dtype import resolve_dtype_name, torch_dtype

    return RMScorer.load(args.rm, device=scoring_device(), dtype=torch_dtype(resolve_dtype_name(args.dtype)),
                         max_length=args.rm_max_length or None, batch_size=args.max_batch)


def scoring_device() -> str:
    """Where a service without --learn scores: this process's GPU when it has one (CUDA_VISIBLE_DEVICES picks it)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_learner(args):
    """(learner, checkpointer) of `--learn`: the RM on a DeepSpeed engine (ZeRO 2, the flags' dtype), its pair
    builder (a verifier pool of its own, the assistant of --negative-source) and the RM guard; the one-process
    service and the replicated learner actor build theirs here."""
    from cooper_openrlhf.algo.negatives import NegativeConfig
    from cooper_openrlhf.algo.registry import NEGATIVE_SOURCES
    from cooper_openrlhf.core import PairConfig
    from cooper_openrlhf.core.pair_builder import PairBuilder
    from cooper_openrlhf.rm.bce_train import make_strategy
    from cooper_openrlhf.rm.model import adamw_config, load_rm, recorded_max_length, usable_max_length
    from cooper_openrlhf.rm.pairwise_update import RMTrainer
    from cooper_openrlhf.runtime.dtype import resolve_dtype_name, torch_dtype
    from cooper_openrlhf.serve.checkpoint import ServiceCheckpoint
    from cooper_openrlhf.serve.learner import Learner, LearnConfig
    from cooper_openrlhf.serve.rm_guard import learner_guard
    from cooper_openrlhf.verify.pool import VerifierPool

    dtype_name = resolve_dtype_name(args.dtype)
    micro = args.rm_micro_batch_size
    strategy = make_strategy(["--ds.zero_stage", "2", "--ds.param_dtype", dtype_name, "--train.seed", str(args.seed),
                              "--train.micro_batch_size", str(micro), "--train.batch_size", str(micro)])
    model, tokenizer, template_version = load_rm(args.rm, dtype=torch_dtype(dtype_name),
                                                 attn_implementation="eager", ds_config=strategy.get_ds_train_config())
    max_length = usable_max_length(model, args.rm_max_length or recorded_max_length(model.config))
    optim = adamw_config(lr=args.rm_lr, weight_decay=args.rm_weight_decay, lr_scheduler=args.rm_lr_scheduler,
                         warmup_ratio=args.rm_warmup_ratio, max_norm=args.rm_max_norm,
                         scheduler_steps=args.rm_schedule_steps * args.rm_updates_per_step)
    engine, optimizer, scheduler = strategy.prepare((model, optim))
    engine.eval()
    trainer = RMTrainer(strategy, engine, optimizer, scheduler, tokenizer, max_length, template_version, micro)
    assistant = _NoAssistant()
    if NEGATIVE_SOURCES[args.negative_source].writes_rewrites:
        from cooper_openrlhf.engines.openai_api import OpenAIChatEngine

        assistant = OpenAIChatEngine(args.assistant_url, args.assistant_model, os.environ.get(args.assistant_key_env))
    builder = PairBuilder(VerifierPool(num_workers=1, deadline_s=args.verify_deadline_s, config=verifier_config(args)),
                          assistant, NegativeConfig(retries=args.negative_retries,
                                                    max_new_tokens=args.negative_max_new_tokens,
                                                    temperature=args.negative_temperature, seed=args.seed),
                          answer_fallback=args.answer_fallback)
    pairs = PairConfig(args.group_size, args.negative_source, args.rollout_negative_pick, args.answerless_negatives,
                       args.seed)
    learner = Learner(trainer, builder, LearnConfig(
        pairs, passes=args.rm_updates_per_step, anchor_weight=args.rm_anchor_weight,
        anchor_batch=args.rm_anchor_batch, health_batch_size=args.max_batch), **learner_guard(args))
    checkpointer = ServiceCheckpoint(trainer, args.state_dir, keep=args.keep_checkpoints)
    return learner, checkpointer


class _NoAssistant:
    """The assistant of `--negative-source rollout`: never asked (a call is a bug)."""

    def generate(self, prompts, sampling):
        raise RuntimeError("no assistant endpoint configured (--negative-source rollout asks for none)")


def side_inputs(args) -> str | None:
    """Read what the flags name beside the RM into `args`: the held-out questions, the probe suite, the RM guard's
    anchors. In the main thread (math-verify's deadline is a signal). The error to print, or None."""
    if args.heldout_prompts:
        from cooper_openrlhf.serve.trainer_groups import heldout_questions

        try:
            args.heldout_questions = heldout_questions(args.heldout_prompts, args.heldout_input_key)
        except ValueError as exc:
            return str(exc)
        logger.info("%d held-out questions (--heldout-prompts): scored, never learned from",
                    len(args.heldout_questions))
    if args.probe_every:  # built here, in the main thread: math-verify's deadline is a signal
        from cooper_openrlhf.serve.probing import ServiceProbe, problems_of

        try:
            args.probe = ServiceProbe(problems_of(args.probe_prompts or args.heldout_prompts), args.probe_every,
                                      args.probe_problems)
        except ValueError as exc:
            return f"--probe-prompts: {exc}"
    if args.learn:  # the RM guard's anchors, in the main thread too (their probes' labels come from math-verify)
        from cooper_openrlhf.serve.rm_guard import service_anchors

        try:
            service_anchors(args)
        except ValueError as exc:
            return f"the RM guard's anchors: {exc}"
    return None


def build_service(args):
    """(service, checkpointer or None): the RM, the verifier lanes, the learner; resumed from --state-dir."""
    from cooper_openrlhf.rm.scorer import RMScorer
    from cooper_openrlhf.serve.metrics import ServiceLog
    from cooper_openrlhf.serve.service import RewardService
    from cooper_openrlhf.serve.verification import SharedLanes
    from cooper_openrlhf.verify.pool import VerifierPool

    config = service_config(args)
    verifier = SharedLanes([VerifierPool(num_workers=1, deadline_s=args.verify_deadline_s,
                                         config=verifier_config(args)) for _ in range(args.verify_workers)],
                           args.verify_deadline_s, lanes=args.verify_lanes)
    learner = checkpointer = restored = None
    if args.learn:  # DeepSpeed places the RM (and so its scoring copy)
        learner, checkpointer = build_learner(args)
        restored = checkpointer.load()
        scorer = RMScorer.of_trainer(learner.trainer, batch_size=args.max_batch, copy_weights=True,
                                     version=restored.state["version"] if restored else 0)
    else:
        scorer = served_scorer(args)
    for old_version, weights in (restored.pinned.items() if restored else ()):  # open groups finish on their own
        scorer.restore(old_version, weights)
    if checkpointer is not None:  # a version number never names two RMs, even after a kill -9 (serve/checkpoint.py)
        from cooper_openrlhf.serve.checkpoint import never_reuse_versions

        never_reuse_versions(scorer, checkpointer)
    log = ServiceLog(os.path.join(args.state_dir, "logs") if args.state_dir else None)
    service = RewardService(config, scorer, verifier.lanes(), log, learner=learner, checkpointer=checkpointer,
                            state=restored.state if restored else None, probe=getattr(args, "probe", None))
    service.verifier_pools = [verifier]  # what shutdown closes: its dispatching threads, then its pools
    return service, checkpointer


def one_process_server(args, token: str | None):
    """The uvicorn server of the one-process service (not yet running): the service, its app and the connection
    limits of the flags. After a graceful stop it has checkpointed, exported and closed the verifier."""
    import uvicorn

    from cooper_openrlhf.serve.app import build_app, server_options

    splitter = build_splitter(args)
    service, checkpointer = build_service(args)

    def shutdown() -> None:
        for pool in service.verifier_pools:
            pool.close()
        if service.learner is not None:
            service.learner.pair_builder.close()
            out = args.export_dir or os.path.join(args.state_dir, "final_rm")
            logger.info("exported the trained RM (version %d) to %s", service.version, checkpointer.export(out))

    app = build_app(service, splitter, token=token, max_body_bytes=args.max_body_bytes,
                    max_request_samples=args.max_request_samples, request_timeout_s=args.request_timeout_s,
                    max_queued_samples=args.max_queued_samples, max_queued_bytes=args.max_queued_bytes,
                    max_sample_chars=args.max_sample_chars, body_timeout_s=args.body_timeout_s,
                    on_shutdown=shutdown)
    too_few_files = open_files_for(args.max_connections)
    if too_few_files:
        logger.warning("%s", too_few_files)
    origin = args.rm if service.version == 0 else f"resumed from {checkpointer.dir}, trained from {args.rm}"
    scheme = "https" if args.ssl_certfile else "http"
    logger.info("serving RM version %d (%s; mode %s, learning %s) at %s://%s:%d/get_reward", service.version, origin,
                args.mode, "on" if args.learn else "off", scheme, args.host, args.port)
    server = _server_class()(uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", access_log=False, ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile, **server_options(keep_alive_s=args.keep_alive_s,
                                                       header_timeout_s=args.header_timeout_s,
                                                       max_connections=args.max_connections)))
    server.service = service
    return server


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that after a graceful shutdown on SIGTERM/SIGINT it does not re-raise the signal:
        the service has checkpointed and exported by then, so the process ends with 0, as a finished job does."""

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    return Server


def open_files_for(connections: int) -> str | None:
    """Raise this process's open-files limit to fit `connections` sockets beside its own files, as far as the hard
    limit allows; a warning when it cannot (None: it fits)."""
    import resource

    needed = connections + OWN_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    raised = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    if raised >= needed:
        return None
    return (f"--max-connections {connections}: the open-files limit is {raised} (hard limit), so past about "
            f"{raised - OWN_FILES} connections new ones fail before the cap answers them; raise it (ulimit -n) or "
            f"lower --max-connections")


