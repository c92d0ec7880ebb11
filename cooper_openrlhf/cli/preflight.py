"""Check a cluster launcher's configuration and print the commands it will run.

    cooper preflight STAGE [options] [-- extra flags]   # = python -m cooper_openrlhf.cli.preflight

The launch scripts in launch_scripts/ call this before submitting (on the login node) and again inside the
job; it needs neither Slurm nor GPUs. STAGE is rl | annotate | verifyrm-train | evaluate; the configuration
comes from environment variables (each launcher's header lists them); arguments after `--` are appended
to the stage's command. On bad input it prints `preflight STAGE: error: VARIABLE=value: what is wrong` and
exits with status 2, in seconds.

  --task K          write/print only task K's command (array stages; default: all)
  --argv-out FILE   write the command as NUL-separated words (bash: mapfile -d '' CMD < FILE)
  --runtime-env-out FILE   rl: write the Ray job's runtime environment (JSON)
  --count           print only the number of tasks (for sbatch --array=0-(count-1))
  --record FILE     inside a job: append this attempt (Slurm job ids, resolved command, the variables read) to
                    FILE (the run folder's launch.json; rl also writes run_info.json with the arm, as the lab does)
  merge-annotations: concatenate finished annotate shards (ANNOTATED, SHARDS) into OUT/verifyrm_data.jsonl
  run-end STATUS:   rl: record how the attempt ended in OUT/launch.json and OUT/run_info.json (done | failed)
"""

import argparse
import json
import os
import sys

EXIT_BAD_INPUT = 2


PROG = "cooper preflight"  # `python -m cooper_openrlhf.cli.preflight` runs the same command


def build_parser() -> argparse.ArgumentParser:
    from cooper_openrlhf.cluster.stage_plans import STAGES

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("stage", choices=[*STAGES, "merge-annotations", "run-end"])
    parser.add_argument("status", nargs="?", type=int, help="run-end: the exit status of the attempt")
    parser.add_argument("--task", type=int, help="only this task's command (array stages)")
    parser.add_argument("--argv-out", help="write the command as NUL-separated words")
    parser.add_argument("--runtime-env-out", help="rl: write the Ray job runtime environment as JSON")
    parser.add_argument("--count", action="store_true", help="print only the number of tasks")
    parser.add_argument("--record", help="inside a job: append this attempt to this launch.json")
    return parser


def _run(args, extra: list[str]) -> int:
    from cooper_openrlhf.cluster.checks import Env, PreflightError
    from cooper_openrlhf.cli.launch_plans import plan_stage
    from cooper_openrlhf.cluster.annotation_shards import merge_annotations
    from cooper_openrlhf.runtime.secrets import shell_line

    env = Env(os.environ)
    if args.stage == "merge-annotations":
        out = env.require("OUT", "the VerifyRM run folder")
        merged = os.path.join(out, "verifyrm_data.jsonl")
        rows = merge_annotations(env.require("ANNOTATED", "the annotate folder"), env.int("SHARDS", 8), merged)
        print(f"merged {rows} labelled rows -> {merged}")
        return 0
    if args.stage == "run-end":
        from cooper_openrlhf.cluster.launch_record import record_end

        record_end(env.require("OUT", "the run folder"), args.status if args.status is not None else 1)
        return 0
    plan = plan_stage(args.stage, env, extra)
    if args.count:
        print(len(plan.commands))
        return 0
    commands = plan.commands
    if args.task is not None:
        if not 0 <= args.task < len(commands):
            raise PreflightError(f"task {args.task}: the {args.stage} stage has tasks 0..{len(commands) - 1}")
        commands = [commands[args.task]]
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    if plan.placement is not None:
        print(f"placement: {plan.placement.describe()}")
    for index, argv in enumerate(commands):
        label = f"task {args.task if args.task is not None else index}: " if len(plan.commands) > 1 else ""
        print(f"{label}{shell_line(argv, os.environ)}")  # secrets redacted: dry runs and job logs are shared
    if args.argv_out:
        if len(commands) != 1:
            raise PreflightError(f"--argv-out needs one command; the {args.stage} stage has {len(commands)}: pass --task")
        with open(args.argv_out, "wb") as handle:
            handle.write(b"".join(word.encode() + b"\0" for word in commands[0]))
    if args.record:
        from cooper_openrlhf.cluster.launch_record import record_attempt

        record_attempt(args.record, plan, commands[0], env)
    if args.runtime_env_out and plan.runtime_env is not None:
        with open(args.runtime_env_out, "w", encoding="utf-8") as handle:
            json.dump(plan.runtime_env, handle)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    args = build_parser().parse_args(own)
    from cooper_openrlhf.cluster.checks import PreflightError

    try:
        return _run(args, extra)
    except PreflightError as exc:
        print(f"preflight {args.stage}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
