"""Serve a reward model over HTTP, learning as it scores (--learn): Cooper behind any trainer's reward URL.

    cooper serve --rm VERIFYRM_DIR [--learn] ...   # = python -m cooper_openrlhf.cli.serve

Serves OpenRLHF's remote-RM protocol at POST /get_reward (`--reward.remote_url http://HOST:PORT/get_reward`), with
/metrics (Prometheus) and /health. With --learn the RM keeps learning from the rollouts it scores (Cooper's RM
update, on rollout negatives or an assistant's rewrites), checkpointing into --state-dir and resuming from it.
docs/serve.md has the protocol, the reward modes, the timing of learning, security and the numbers.
"""

import argparse
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
    from cooper_openrlhf.serve.published_names import (PARTIAL_STEP_AFTER_S_FLAG, RM_SCHEDULE_STEPS_FLAG,
                                                       RM_UPDATES_PER_STEP_FLAG)
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
    g.add_argument("--retry-record", type=int, default=ServiceConfig.retry_record,
                   help="answers kept to recognise a retry (a client resends what it did not get back): a sample "
                        "identical to one answered in the same step is answered again, not scored or counted again. "
                        "Keep it at or above the trainer's samples per step (the default: 4,096 prompts x 16); an "
                        "answer's text is not kept once its group closes (benchmarks/group_bookkeeping.py measures "
                        "what one costs)")
    g.add_argument(PARTIAL_STEP_AFTER_S_FLAG, dest="partial_step_after_s", type=float,
                   default=ServiceConfig.partial_step_after_s,
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
    g.add_argument(RM_UPDATES_PER_STEP_FLAG, dest="rm_updates_per_step", type=int, default=1,
                   help="optimizer steps over a round's pairs")
    g.add_argument(RM_SCHEDULE_STEPS_FLAG, dest="rm_schedule_steps", type=int, default=1000,
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
        from cooper_openrlhf.algo.registry import NEGATIVE_SOURCES

        if NEGATIVE_SOURCES[args.negative_source].writes_rewrites and not (args.assistant_url and args.assistant_model):
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


def main(argv: list[str] | None = None) -> int:
    from cooper_openrlhf.serve.build import one_process_server, service_config, side_inputs

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
    problem = side_inputs(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from cooper_openrlhf.runtime import install_cpu_runtime

    install_cpu_runtime()
    if args.replicas:  # the same flags, the same app, on Ray Serve (serve/replicated/)
        from cooper_openrlhf.serve.replicated.launch import serve_replicated

        return serve_replicated(args, service_config(args), token=token)
    one_process_server(args, token).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
