"""The reward service's RM guard flags (`cooper serve --rm-guard ...`) and the anchors the guard scores.

The same guard as the trainer's (`core/rm_health.py`, `--cooper.rm_guard*`), with the service's flag spelling:
--rm-guard rollback|watch|off, --rm-guard-response lower_lr|skip (a service has no run to stop), and the bounds.
Anchors (`rm/anchors.py`): --rm-anchors FILE, else the VerifyRM recipe's eval_split.jsonl beside --rm; plus the probe
suite on --rm-anchor-probe-problems problems of --probe-prompts (or --heldout-prompts). They are built in the main
thread (math-verify's deadline is a signal) by `service_anchors`, before the learner, and handed to it by
`learner_guard`. `serve/learner.py` does the rest.
"""

import logging
import os
import re

from cooper_openrlhf.core.rm_health import GuardConfig, RMGuard
from cooper_openrlhf.rm.anchors import ANCHOR_WEIGHT

logger = logging.getLogger(__name__)


def add_guard_flags(group) -> None:
    """--rm-guard* and --rm-anchor* on the service's learning group."""
    for flag, kind, default, text, choices in GuardConfig.flags("--rm-guard"):
        if flag == "--rm-guard-response":
            choices = tuple(c for c in choices if c != "stop")
            text = text.replace("; 'stop' checkpoints the step (with the healthy RM) and ends the run", "")
        group.add_argument(flag, type=kind, default=default, choices=choices,
                           help=re.sub(r"--cooper\.rm_guard(\w*)", lambda m: "--rm-guard" + m[1].replace("_", "-"),
                                       text))
    group.add_argument("--rm-anchors", default=None,
                       help="labelled rows kept out of the RM's training (question, reference, completion, label; or "
                            "VerifyBench rows) the guard scores after every update; default: eval_split.jsonl beside "
                            "--rm (the VerifyRM recipe's held-out split), looked for in its folder and the two above")
    group.add_argument("--rm-anchor-rows", type=int, default=64, help="labelled rows the guard reads (the rest, other "
                       "questions, feed --rm-anchor-weight)")
    group.add_argument("--rm-anchor-probe-problems", type=int, default=4,
                       help="problems of --probe-prompts (or --heldout-prompts) whose probe suite joins the anchors")
    group.add_argument("--rm-anchor-weight", type=float, default=ANCHOR_WEIGHT,
                       help="anchored updates: BCE on labelled rows beside the pairwise loss, at this weight (the "
                       "default, as the RM guard pilot chose: docs/cooper_step.md; 0: the paper's update)")
    group.add_argument("--rm-anchor-batch", type=int, default=16, help="labelled rows per anchored update")


def guard_flag_problems(args) -> list[str]:
    problems = []
    try:
        GuardConfig.from_namespace(args)
    except ValueError as exc:
        problems.append(f"--rm-guard: {exc}")
    if args.rm_anchors and not os.path.isfile(args.rm_anchors):
        problems.append(f"--rm-anchors {args.rm_anchors}: no such file")
    if args.rm_anchor_weight < 0 or args.rm_anchor_batch < 1 or args.rm_anchor_rows < 0:
        problems.append("--rm-anchor-weight and --rm-anchor-rows must be >= 0, --rm-anchor-batch >= 1")
    return problems


def service_anchors(args) -> None:
    """Build the anchors into `args.rm_anchor_sets` ((health anchors, training rows)); in the main thread. A
    ValueError names a file that cannot be read."""
    from cooper_openrlhf.rm.anchors import anchor_sets, describe
    from cooper_openrlhf.serve.probing import problems_of

    source = args.probe_prompts or args.heldout_prompts
    problems = problems_of(source) if source and args.rm_anchor_probe_problems else []

    anchors, rows, source = anchor_sets(args.rm, args.rm_anchors, args.rm_anchor_rows, problems,
                                        args.rm_anchor_probe_problems, args.seed)
    args.rm_anchor_sets = (anchors, rows)
    config = GuardConfig.from_namespace(args)
    if config.measures and not anchors:
        logger.warning("RM guard off: no anchors (%s, and no --probe-prompts/--heldout-prompts problems with an "
                       "integer reference); pass --rm-anchors FILE", source)
    elif config.measures:
        logger.info("RM guard %s: %s (%s)", config.mode, describe(anchors), source)
    if args.rm_anchor_weight > 0 and not rows:
        logger.warning("--rm-anchor-weight %g: no labelled rows beyond the guard's to train on; updates are not "
                       "anchored", args.rm_anchor_weight)


def learner_guard(args) -> dict:
    """The `serve.learner.Learner` keyword arguments of the guard: guard, anchors, anchor_rows."""
    anchors, rows = getattr(args, "rm_anchor_sets", ((), ()))
    return {"guard": RMGuard(GuardConfig.from_namespace(args)), "anchors": anchors, "anchor_rows": rows}
