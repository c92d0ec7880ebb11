"""Serve a reward model over HTTP, learning as it scores (--learn): Cooper behind any trainer's reward URL.

    cooper serve --rm VERIFYRM_DIR [--learn] ...   # = python -m cooper_openrlhf.cli.serve

Serves OpenRLHF's remote-RM protocol at POST /get_reward (`--reward.remote_url http://HOST:PORT/get_reward`), with
/metrics (Prometheus) and /health. With --learn the RM keeps learning from the rollouts it scores (Cooper's RM
update, on rollout negatives or an assistant's rewrites), checkpointing into --state-dir and resuming from it.
docs/serve.md has the protocol, the reward modes, the timing of learning, security and the numbers.
"""

import argparse
import copy
import ipaddress
import logging
import os
import shlex
import sys
from dataclasses import fields

logger = logging.getLogger("cooper_openrlhf.serve")

# The RM's OpenMP threads share the cores with the event loop, the verifier workers and the learner. libgomp's
# default makes a thread spin at every barrier, taking the CPU those need; and when a core is taken from a spinner
# mid-forward, the forward waits for it (a tiny RM's batch-1 forward on 2 shared cores: milliseconds passive,
# hundreds of milliseconds spinning; benchmarks/serve_throughput.py). Passive threads sleep instead. libgomp reads
# this when torch loads, so it is set on import, before torch; a value the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


PROG = "cooper serve"  # `python -m cooper_openrlhf.cli.serve` runs the same command


def build_parser() -> argparse.ArgumentParser:
    from cooper_openrlhf.algo.hacking import HackingMonitorConfig
    from cooper_openrlhf.algo.registry import NEGATIVE_SOURCES, ROLLOUT_NEGATIVE_PICKS
    from cooper_openrlhf.cli.cooper_args import RM_LR_SCHEDULERS
    from cooper_openrlhf.runtime.dtype import DTYPE_CHOICES
    from cooper_openrlhf.serve import app
    from cooper_openrlhf.core import REWARD_MODES
    from cooper_openrlhf.serve.service import ON_HACKING, ServiceConfig
    from cooper_openrlhf.serve.replicated.flags import VERIFY_LANES_DEFAULT, VERIFY_WORKERS_DEFAULT, add_replicated_flags
    from cooper_openrlhf.serve.validation import DEFAULT_MAX_SAMPLE_CHARS
    from cooper_openrlhf.verify.extract import FALLBACKS

    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rm", required=True,
                   help="VerifyRM folder: a one-logit sequence classifier, as `cooper verifyrm train` exports one")
    p.add_argument("--policy", default=None,
                   help="the policy's model or tokenizer folder: its chat template is how prompts are split into "
                        "questions (OpenRLHF's --data.apply_chat_template); optional with --no-chat-template (then "
                        "only its special tokens are read)")
    p.add_argument("--no-chat-template", action="store_true", help="prompts are the questions themselves (optionally "
                   "through --input-template), as OpenRLHF without --data.apply_chat_template")
    p.add_argument("--input-template", default=None,
                   help="with --no-chat-template: OpenRLHF's --data.input_template, e.g. 'Q: {}\\nA:'")
    g = p.add_argument_group("network and security")
    g.add_argument("--host", default="127.0.0.1", help="address to bind; beyond loopback a --token-file is required")
    g.add_argument("--port", type=int, default=5000, help="port to listen on")
    g.add_argument("--token-file", default=None, help="file holding the token clients must send (Bearer or ?token=)")
    g.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (PEM; uvicorn's own TLS)")
    g.add_argument("--ssl-keyfile", default=None, help="the certificate's private key (PEM)")
    g.add_argument("--max-body-bytes", type=int, default=4 << 20,
                   help="a request body over this many bytes is refused (413) without being read further")
    g.add_argument("--max-request-samples", type=int, default=256,
                   help="most samples in one request (413 past it); OpenRLHF sends one per request")
    g.add_argument("--body-timeout-s", type=float, default=app.DEFAULT_BODY_TIMEOUT_S,
                   help="a request body not all arrived within this many seconds of its first read is answered 408")
    g.add_argument("--header-timeout-s", type=float, default=app.DEFAULT_HEADER_TIMEOUT_S,
                   help="a connection that has not sent a whole request head this long after opening (or after its "
                        "last answer) is closed")
    g.add_argument("--keep-alive-s", type=int, default=app.DEFAULT_KEEP_ALIVE_S,
                   help="an idle keep-alive connection is closed after this many seconds (uvicorn's "
                        "timeout_keep_alive)")
    g.add_argument("--max-connections", type=int, default=app.DEFAULT_MAX_CONNECTIONS,
                   help="past this many open connections a request is answered 503 (uvicorn's limit_concurrency); "
                        "the open-files limit is raised to fit it where the hard limit allows. One process only: "
                        "with --replicas Ray Serve's proxy holds the connections")
    g.add_argument("--request-timeout-s", type=float, default=150.0,
                   help="a request that waited this long for the scorer is answered 504 (OpenRLHF's client gives "
                        "up at 180 s)")
    g.add_argument("--max-queued-samples", type=int, default=app.DEFAULT_MAX_QUEUED_SAMPLES,
                   help="a memory bound, not a load limit: past this many samples admitted and not yet answered a "
                        "new request is refused (503, Retry-After); below it a busy scorer is waited for. The "
                        "default is 4x a rollout batch of 1,024 prompts x 16 samples (per ingress replica with "
                        "--replicas)")
    g.add_argument("--max-queued-bytes", type=int, default=app.DEFAULT_MAX_QUEUED_BYTES,
                   help="the same bound on the request bodies in flight, counted as they arrive (per ingress "
                        "replica with --replicas)")
    g.add_argument("--max-sample-chars", type=int, default=DEFAULT_MAX_SAMPLE_CHARS,
                   help="most characters in one sample's query, prompt or label (400 naming the sample past it)")
    add_replicated_flags(p)
    g = p.add_argument_group("scoring")
    g.add_argument("--mode", default="rm", choices=REWARD_MODES, help="the reward paid (docs/serve.md)")
    g.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help="RM weights' dtype (auto: the device's fast one)")
    g.add_argument("--max-batch", type=int, default=64, help="most samples per RM forward")
    g.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="longest wait for a batch to fill, only while the scorer is busy (a request on an idle "
                        "lane runs at once); with --replicas every scoring replica's batch waits up to this long")
    g.add_argument("--rm-max-length", type=int, default=None, help="tokens per RM input (default: the export's)")
    g.add_argument("--verify-lanes", type=int, default=VERIFY_LANES_DEFAULT,
                   help="batches of samples handed to the rule verifier at once (one process; a --replicas replica "
                        "has one pool)")
    g.add_argument("--verify-workers", type=int, default=VERIFY_WORKERS_DEFAULT,
                   help="rule-verifier worker processes (~15 MiB each) shared by the lanes, one sample at a time each: "
                        "a slow answer holds one, the others go on (one process; serve/verification.py)")
    g.add_argument("--verify-deadline-s", type=float, default=5.0,
                   help="a sample's rule verdict is awaited at most this long from when a verifier lane takes it, "
                        "its wait behind slower answers included; past it the sample is paid the RM's reward and "
                        "logged not verified (serve/verification.py). Also the verifier workers' hard limit per item")
    g.add_argument("--answer-fallback", default="none", choices=FALLBACKS,
                   help="how a completion's final answer is found (the trainer's --cooper.answer_fallback): none = "
                        "only an explicit one (\\boxed{}, '####', 'the answer is'); last_number also takes the last "
                        "number of the text")
    g = p.add_argument_group("GRPO groups, learning and the hacking monitor")
    g.add_argument("--group-size", type=int, default=8, help="the trainer's samples per prompt (n)")
    g.add_argument("--groups-per-update", type=int, default=0,
                   help="complete groups per round = the trainer's prompts per step (--rollout.batch_size); each "
                        "round is monitored and, with --learn, trained on; 0: no rounds")
    g.add_argument("--group-timeout-s", type=float, default=ServiceConfig.group_timeout_s,
                   help="a group that gets no sample for this long is dropped from learning (its samples were paid); "
                        "timed from its last sample, so set it above the longest gap between two samples of a prompt")
    g.add_argument("--stale-after-s", type=float, default=ServiceConfig.stale_after_s,
                   help="after this long without any sample (a trainer restarted mid-step), the partial groups are "
                        "dropped before the next sample is placed, so a new policy's samples never join them, and "
                        "identical texts count as new samples, not retries")
    g.add_argument("--partial-round-after-s", type=float, default=ServiceConfig.partial_round_after_s,
                   help="complete groups left over when no sample came for this long (the trainer between steps: an "
                        "episode's partial last step) form a round of their own; set it above the trainer's longest "
                        "pause within a step")
    g.add_argument("--update-wait-timeout-s", type=float, default=ServiceConfig.update_wait_timeout_s,
                   help="a new group waits at most this long for the RM update in flight, then takes the latest "
                        "version")
    g.add_argument("--heldout-prompts", default=None,
                   help="the file given to OpenRLHF's --eval.dataset: its prompts are scored, never learned from")
    g.add_argument("--heldout-input-key", default="input", help="the question's field in --heldout-prompts")
    g.add_argument("--probe-every", type=int, default=0,
                   help="read the probe suite (what the RM pays known attack forms, rm/probes.py) on the current RM "
                        "every N rounds (so with --groups-per-update), into the rounds' log and /metrics (0: never)")
    g.add_argument("--probe-prompts", default=None,
                   help="problems to build the probes from (rows with fields input and label; default: the "
                        "--heldout-prompts file, read by those fields whatever --heldout-input-key says)")
    g.add_argument("--probe-problems", type=int, default=16, help="problems with an integer reference the suite uses")
    g.add_argument("--no-group-check", action="store_true",
                   help="no warnings when the trainer's GRPO groups are seen not to match --group-size / "
                        "--groups-per-update (a trainer that filters samples); scoring is never refused either way "
                        "(docs/serve.md)")
    g.add_argument("--learn", action="store_true", help="train the RM on each round (Cooper's RM update)")
    g.add_argument("--no-wait-for-update", action="store_true",
                   help="new groups do not wait for an update in flight (async trainers; docs/serve.md)")
    g.add_argument("--negative-source", default="rollout", choices=NEGATIVE_SOURCES,
                   help="rollout: the group's own proven-wrong rollouts; assistant: rewrites by --assistant-url; "
                        "mixed: a rollout negative where the group has one, else a rewrite")
    g.add_argument("--rollout-negative-pick", default="hardest", choices=ROLLOUT_NEGATIVE_PICKS,
                   help="which proven-wrong rollout of a group is its negative: the one the RM pays most, or random "
                        "(the trainer's --cooper.rollout_negative_pick)")
    g.add_argument("--answerless-negatives", action="store_true",
                   help="a rollout without a final answer may be a negative (the trainer's "
                        "--cooper.answerless_negatives)")
    g.add_argument("--assistant-url", default=None, help="OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1)")
    g.add_argument("--assistant-model", default=None, help="model name at --assistant-url")
    g.add_argument("--assistant-key-env", default="COOPER_ASSISTANT_API_KEY",
                   help="environment variable holding the assistant endpoint's key, if it needs one")
    g.add_argument("--negative-max-new-tokens", type=int, default=512, help="tokens per assistant rewrite")
    g.add_argument("--negative-temperature", type=float, default=1.0, help="sampling temperature of the rewrites")
    g.add_argument("--negative-retries", type=int, default=3, help="attempts per prompt for a valid rewrite")
    g.add_argument("--rm-lr", type=float, default=1e-5, help="the RM's learning rate (the trainer's --cooper.rm_lr)")
    g.add_argument("--rm-weight-decay", type=float, default=0.0, help="the RM optimizer's AdamW weight decay")
    g.add_argument("--rm-max-norm", type=float, default=1.0, help="gradient clipping norm of the RM update")
    g.add_argument("--rm-micro-batch-size", type=int, default=4, help="RM inputs per training forward (a pair is two)")
    g.add_argument("--rm-updates-per-round", type=int, default=1, help="optimizer steps over a round's pairs")
    g.add_argument("--rm-schedule-rounds", type=int, default=1000,
                   help="RM updates (rounds with a valid pair) the LR schedule spans, x --rm-updates-per-round "
                        "optimizer steps each")
    g.add_argument("--rm-lr-scheduler", default="constant_with_warmup", choices=RM_LR_SCHEDULERS,
                   help="the RM's LR schedule over --rm-schedule-rounds (the trainer's --cooper.rm_lr_scheduler)")
    g.add_argument("--rm-warmup-ratio", type=float, default=0.0,
                   help="share of the schedule spent warming up (the trainer's --cooper.rm_warmup_ratio, default "
                        "0.01 there: its first RM step then has LR 0)")
    g.add_argument("--seed", type=int, default=0, help="seed of the RM update and of the negatives' sampling")
    g.add_argument("--on-hacking", default="warn", choices=ON_HACKING,
                   help="on a hacking alarm: warn, or pay the rule reward from then on")
    from cooper_openrlhf.serve.rm_guard import add_guard_flags

    add_guard_flags(p.add_argument_group("the RM guard (with --learn; core/rm_health.py, docs/cooper_step.md)"))
    g = p.add_argument_group("the hacking monitor (the trainer's rule, algo/hacking.py; a step is a round here)")
    for f in fields(HackingMonitorConfig):
        g.add_argument(f"--hacking-{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                       help=f.metadata.get("help"))
    g = p.add_argument_group("state")
    g.add_argument("--state-dir", default=None, help="checkpoints (resumed from on start) and logs; needed by --learn")
    g.add_argument("--checkpoint-every", type=int, default=1, help="updates between checkpoints (0: on shutdown only)")
    g.add_argument("--keep-checkpoints", type=int, default=3,
                   help="checkpoints kept in --state-dir (the newest; the one a restart loads is never deleted)")
    g.add_argument("--export-dir", default=None, help="with --learn: on shutdown, the trained RM as a VerifyRM folder "
                   "(default: STATE_DIR/final_rm)")
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_args(args) -> list[str]:
    """Mistakes a user can make, each naming its flag (empty: none)."""
    from cooper_openrlhf.serve.replicated.flags import replicated_flag_problems

    problems = []
    if not os.path.isdir(args.rm):
        problems.append(f"--rm {args.rm}: no such folder")
    else:
        problems += rm_problems(args.rm)
    if not is_loopback(args.host) and not args.token_file:
        problems.append(f"--host {args.host} is reachable beyond this machine; pass --token-file (clients then send "
                        "the token), or bind 127.0.0.1")
    if args.token_file and not os.path.isfile(args.token_file):
        problems.append(f"--token-file {args.token_file}: no such file; make one: "
                        f"{make_token_command(args.token_file)}")
    if args.policy is None and not args.no_chat_template:
        problems.append("--policy PATH (whose chat template built the prompts) or --no-chat-template is required")
    if args.policy is not None and not os.path.isdir(args.policy):
        problems.append(f"--policy {args.policy}: no such folder")
    if args.input_template and not args.no_chat_template:
        problems.append("--input-template applies only with --no-chat-template (as OpenRLHF's --data.input_template)")
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        problems.append("--ssl-certfile and --ssl-keyfile go together")
    for flag in ("ssl_certfile", "ssl_keyfile"):
        if getattr(args, flag) and not os.path.isfile(getattr(args, flag)):
            problems.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}: no such file")
    if args.probe_every < 0:
        problems.append("--probe-every must be >= 0")
    if args.probe_every and not args.groups_per_update:
        problems.append("--probe-every reads the probe suite at rounds, which need --groups-per-update")
    if args.export_dir and not args.learn:
        problems.append("--export-dir exports the RM --learn trains; without it the RM is the one given (--rm)")
    if args.probe_every and not (args.probe_prompts or args.heldout_prompts):
        problems.append("--probe-every needs --probe-prompts FILE (or --heldout-prompts): the problems to probe with")
    if args.probe_prompts and not os.path.isfile(args.probe_prompts):
        problems.append(f"--probe-prompts {args.probe_prompts}: no such file")
    if args.heldout_prompts and not os.path.isfile(args.heldout_prompts):
        problems.append(f"--heldout-prompts {args.heldout_prompts}: no such file")
    if args.learn:
        if not args.groups_per_update:
            problems.append("--learn needs --groups-per-update (the trainer's prompts per step)")
        if not args.state_dir:
            problems.append("--learn needs --state-dir (checkpoints: nothing learned is lost on a restart)")
        if args.keep_checkpoints < 1:
            problems.append("--keep-checkpoints must be >= 1 (the checkpoint a restart loads is never deleted)")
        if args.negative_source != "rollout" and not (args.assistant_url and args.assistant_model):
            problems.append(f"--negative-source {args.negative_source} needs --assistant-url and --assistant-model")
    problems += replicated_flag_problems(args)
    from cooper_openrlhf.serve.rm_guard import guard_flag_problems

    problems += guard_flag_problems(args)
    for flag in ("body_timeout_s", "header_timeout_s", "verify_deadline_s"):
        if getattr(args, flag) <= 0:
            problems.append(f"--{flag.replace('_', '-')} must be > 0")
    if not 0.0 <= args.rm_warmup_ratio < 1.0:
        problems.append(f"--rm-warmup-ratio must be in [0, 1), got {args.rm_warmup_ratio}")
    if args.max_queued_samples < args.max_request_samples or args.max_queued_bytes < args.max_body_bytes:
        problems.append("--max-queued-samples and --max-queued-bytes must be at least --max-request-samples and "
                        "--max-body-bytes (a request larger than the bound could never be admitted)")
    for flag in ("group_size", "max_batch", "max_queued_samples", "max_queued_bytes", "max_sample_chars",
                 "verify_lanes", "verify_workers", "rm_micro_batch_size", "max_connections", "keep_alive_s"):
        if getattr(args, flag) < 1:
            problems.append(f"--{flag.replace('_', '-')} must be >= 1")
    return problems


def rm_problems(path: str) -> list[str]:
    """What is wrong with `path` as --rm (empty: it is a VerifyRM), read from its config alone (no weights)."""
    from cooper_openrlhf.rm.model import NotASequenceClassifierError, check_reward_model

    try:
        check_reward_model(path)
    except NotASequenceClassifierError as exc:
        found = str(exc).split(". To start a reward model", 1)[0]  # that advice names a flag serve does not have
        found = found[len(path):].strip() if found.startswith(path) else found
        return [f"--rm {path} {found}: expected a VerifyRM (a one-logit sequence classifier). Make one from a model: "
                f"cooper verifyrm train --model.model_name_or_path MODEL --init-head --data.dataset ROWS.jsonl "
                f"--ckpt.output_dir OUT, then --rm OUT (docs/verifyrm.md)"]
    return []


def plain_http_warning(args) -> str | None:
    """The start-up warning of a service reachable beyond this machine over plain http (None: loopback or TLS)."""
    if is_loopback(args.host) or args.ssl_certfile:
        return None
    return (f"listening on {args.host} over plain http: the token and every sample cross the network in clear text; "
            f"serve HTTPS with --ssl-certfile and --ssl-keyfile (docs/serve.md, Security and limits)")


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


OWN_FILES = 1024  # the process's own descriptors beside its sockets: model files, verifier pipes, logs, checkpoints
MIN_TOKEN_CHARS = 16


def make_token_command(path: str) -> str:
    """The shell line that writes a random token (43 URL-safe characters) to `path`, readable by its owner only."""
    quoted = shlex.quote(path)
    return f"python -c \"import secrets; print(secrets.token_urlsafe(32))\" > {quoted} && chmod 600 {quoted}"


def read_token(path: str | None) -> str | None:
    if not path:
        return None
    token = open(path, encoding="utf-8").read().strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise SystemExit(f"error: --token-file {path}: the token is {len(token)} characters; use at least "
                         f"{MIN_TOKEN_CHARS}. Make one: {make_token_command(path)}")
    return token


def build_splitter(args):
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
                         partial_round_after_s=args.partial_round_after_s,
                         update_wait_timeout_s=args.update_wait_timeout_s, max_batch=args.max_batch,
                         max_wait_s=args.max_wait_ms / 1000,
                         wait_for_update=not args.no_wait_for_update, checkpoint_every=args.checkpoint_every,
                         on_hacking=args.on_hacking, check_groups=not args.no_group_check,
                         heldout=getattr(args, "heldout_questions", frozenset()),
                         monitor=HackingMonitorConfig(**{f.name: getattr(args, f"hacking_{f.name}")
                                                         for f in fields(HackingMonitorConfig)}))


def build_service(args):
    """(service, checkpointer or None): the RM, the verifier lanes, the learner; resumed from --state-dir."""
    from cooper_openrlhf.rm.model import load_rm, recorded_max_length, usable_max_length
    from cooper_openrlhf.runtime.dtype import resolve_dtype_name, torch_dtype
    from cooper_openrlhf.serve.metrics import ServiceLog
    from cooper_openrlhf.rm.scorer import RMScorer
    from cooper_openrlhf.serve.service import RewardService
    from cooper_openrlhf.serve.verification import SharedLanes
    from cooper_openrlhf.verify.pool import VerifierPool

    dtype_name = resolve_dtype_name(args.dtype)
    config = service_config(args)
    verifier = SharedLanes([VerifierPool(num_workers=1, deadline_s=args.verify_deadline_s,
                                         config=verifier_config(args)) for _ in range(args.verify_workers)],
                           args.verify_deadline_s, lanes=args.verify_lanes)
    learner = checkpointer = restored = None
    if args.learn:
        learner, checkpointer, model, tokenizer, version = _build_learner(args, dtype_name)
        restored = checkpointer.load()
        version = restored.state["version"] if restored else 0
        scoring_model = copy.deepcopy(learner.trainer.model.module)
        max_length = learner.trainer.max_length
        template_version = learner.trainer.template_version
    else:
        scoring_model, tokenizer, template_version = load_rm(args.rm, dtype=torch_dtype(dtype_name))
        scoring_model.to(scoring_device())  # with --learn DeepSpeed places the RM (and so its scoring copy)
        max_length = usable_max_length(scoring_model, args.rm_max_length or recorded_max_length(scoring_model.config))
        version = 0
    scorer = RMScorer(scoring_model, tokenizer, max_length=max_length,  # it copies the tokenizer (thread safety)
                             template_version=template_version, batch_size=args.max_batch, version=version)
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


def verifier_config(args):
    """The rule verifier's config: answers found as the trainer's pair actor finds them (`--answer-fallback`; the
    verifier's own default, last_number, would mark correct what the trainer calls answerless)."""
    from cooper_openrlhf.verify.rule import RuleVerifierConfig

    return RuleVerifierConfig(answer_fallback=args.answer_fallback)


def scoring_device() -> str:
    """Where a service without --learn scores: this process's GPU when it has one (CUDA_VISIBLE_DEVICES picks it)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _build_learner(args, dtype_name: str):
    from cooper_openrlhf.algo.negatives import NegativeConfig
    from cooper_openrlhf.core.pair_builder import PairBuilder
    from cooper_openrlhf.rm.bce_train import make_strategy
    from cooper_openrlhf.rm.model import adamw_config, load_rm, recorded_max_length, usable_max_length
    from cooper_openrlhf.rm.pairwise_update import RMTrainer
    from cooper_openrlhf.runtime.dtype import torch_dtype
    from cooper_openrlhf.serve.checkpoint import ServiceCheckpoint
    from cooper_openrlhf.serve.learner import Learner, LearnConfig
    from cooper_openrlhf.serve.rm_guard import learner_guard
    from cooper_openrlhf.verify.pool import VerifierPool

    micro = args.rm_micro_batch_size
    strategy = make_strategy(["--ds.zero_stage", "2", "--ds.param_dtype", dtype_name, "--train.seed", str(args.seed),
                              "--train.micro_batch_size", str(micro), "--train.batch_size", str(micro)])
    model, tokenizer, template_version = load_rm(args.rm, dtype=torch_dtype(dtype_name),
                                                 attn_implementation="eager", ds_config=strategy.get_ds_train_config())
    max_length = usable_max_length(model, args.rm_max_length or recorded_max_length(model.config))
    optim = adamw_config(lr=args.rm_lr, weight_decay=args.rm_weight_decay, lr_scheduler=args.rm_lr_scheduler,
                         warmup_ratio=args.rm_warmup_ratio, max_norm=args.rm_max_norm,
                         scheduler_steps=args.rm_schedule_rounds * args.rm_updates_per_round)
    engine, optimizer, scheduler = strategy.prepare((model, optim))
    engine.eval()
    trainer = RMTrainer(strategy, engine, optimizer, scheduler, tokenizer, max_length, template_version, micro)
    assistant = _NoAssistant()
    if args.negative_source != "rollout":
        from cooper_openrlhf.engines.openai_api import OpenAIChatEngine

        assistant = OpenAIChatEngine(args.assistant_url, args.assistant_model, os.environ.get(args.assistant_key_env))
    builder = PairBuilder(VerifierPool(num_workers=1, deadline_s=args.verify_deadline_s, config=verifier_config(args)),
                          assistant, NegativeConfig(retries=args.negative_retries,
                                                    max_new_tokens=args.negative_max_new_tokens,
                                                    temperature=args.negative_temperature, seed=args.seed),
                          answer_fallback=args.answer_fallback)
    learner = Learner(trainer, builder, LearnConfig(
        groups_per_update=args.groups_per_update, negative_source=args.negative_source,
        rollout_negative_pick=args.rollout_negative_pick, answerless_negatives=args.answerless_negatives,
        passes=args.rm_updates_per_round, seed=args.seed, anchor_weight=args.rm_anchor_weight,
        anchor_batch=args.rm_anchor_batch, health_batch_size=args.max_batch), **learner_guard(args))
    checkpointer = ServiceCheckpoint(trainer, args.state_dir, keep=args.keep_checkpoints)
    return learner, checkpointer, model, tokenizer, 0


def replica_learner(args):
    """(learner, checkpointer) of the replicated service's learner actor (`serve/replicated/learner_actor.py`),
    built there as one process builds its own."""
    from cooper_openrlhf.runtime.dtype import resolve_dtype_name

    learner, checkpointer, *_ = _build_learner(args, resolve_dtype_name(args.dtype))
    return learner, checkpointer


class _NoAssistant:
    """The assistant of `--negative-source rollout`: never asked (a call is a bug)."""

    def generate(self, prompts, sampling):
        raise RuntimeError("no assistant endpoint configured (--negative-source rollout asks for none)")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    problems = check_args(args)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    token = read_token(args.token_file)
    warning = plain_http_warning(args)
    if warning:
        logger.warning("%s", warning)
    if args.heldout_prompts:
        from cooper_openrlhf.serve.trainer_groups import heldout_questions

        try:
            args.heldout_questions = heldout_questions(args.heldout_prompts, args.heldout_input_key)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        logger.info("%d held-out questions (--heldout-prompts): scored, never learned from",
                    len(args.heldout_questions))
    if args.probe_every:  # built here, in the main thread: math-verify's deadline is a signal
        from cooper_openrlhf.serve.probing import ServiceProbe, problems_of

        try:
            args.probe = ServiceProbe(problems_of(args.probe_prompts or args.heldout_prompts), args.probe_every,
                                      args.probe_problems)
        except ValueError as exc:
            print(f"error: --probe-prompts: {exc}", file=sys.stderr)
            return 2
    if args.learn:  # the RM guard's anchors, in the main thread too (their probes' labels come from math-verify)
        from cooper_openrlhf.serve.rm_guard import service_anchors

        try:
            service_anchors(args)
        except ValueError as exc:
            print(f"error: the RM guard's anchors: {exc}", file=sys.stderr)
            return 2
    from cooper_openrlhf.runtime import install_cpu_runtime

    install_cpu_runtime()
    if args.replicas:  # the same flags, the same app, on Ray Serve (serve/replicated/)
        from cooper_openrlhf.serve.replicated.launch import serve_replicated

        return serve_replicated(args, service_config(args), token=token, build_splitter=build_splitter,
                                build_learner=replica_learner)
    one_process_server(args, token).run()
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
