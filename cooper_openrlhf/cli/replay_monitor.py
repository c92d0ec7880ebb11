"""Re-judge finished runs with the reward-hacking rule at the thresholds given.

    cooper inspect replay-monitor RUN_DIR [RUN_DIR ...] [--cooper.hacking_* ...]
    # = python -m cooper_openrlhf.cli.replay_monitor ...

Feeds each run's logged metrics to the reward-hacking rule again (`report/replay.py`) with the thresholds given
(`--cooper.hacking_*`, the same flags and defaults as train_cooper) and prints, per run, the alarm steps the run
logged and those the rule gives now, the first of them and the rules that fired, beside what the alarm is
for: held-out accuracy first, at its lowest (and the step) and last, the gap's step-to-step noise, and what the
RM paid verified-wrong rollouts (5-step means: first, highest and the step ending it, last). Then per
arm: how many runs the replayed alarm fired on, and how many of those while less than half of the run's
held-out fall (first -> lowest) was behind it, and how many came in a closed episode (what the RM paid wrong
rollouts rose by >= gap_growth, 5-step means, and fell back to within half of that by the end: hacking that
training undid, so an alarm there was no false one); with --held-at F, split into the runs whose last held-out
accuracy is >= F (where an alarm warned of a fall that did not come) and the others. RUN_DIR as for cli.report.
"""

import argparse
import math
import sys
from pathlib import Path
from types import SimpleNamespace


PROG = "cooper inspect replay-monitor"  # `python -m cooper_openrlhf.cli.replay_monitor` runs the same command


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from cooper_openrlhf.algo.hacking import HackingMonitorConfig

    parser = argparse.ArgumentParser(prog=PROG,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="One folder per run (arm and seed).")
    parser.add_argument("--held-at", type=float, default=None, metavar="F",
                        help="count a run as held when its last held-out accuracy is >= F, and split the per-arm "
                        "alarm counts by it")
    parser.add_argument("--heldout-samples", type=float, default=None,
                        help="graded samples per held-out evaluation, for runs logged before eval/samples existed")
    for flag, kind, default, help_text in HackingMonitorConfig.flags():
        parser.add_argument(flag, type=kind, default=default, help=help_text)
    return parser.parse_args(argv)


def _alarm_counts(runs, rise: float) -> str:
    """runs: (AlarmOutcome, WrongRewardCourse or None) per run."""
    alarmed = [(outcome, course) for outcome, course in runs if outcome.first_alarm is not None]
    closed = sum(course is not None and course.closed_episode(rise) for _, course in alarmed)
    return (f"alarm on {len(alarmed)} of {len(runs)} runs ({sum(o.early for o, _ in alarmed)} early, "
            f"{closed} in a closed episode)")


def main(argv: list[str] | None = None) -> int:
    from cooper_openrlhf.algo.hacking import FLAG_PREFIX, HackingMonitorConfig
    from cooper_openrlhf.report.aggregate import heldout_series
    from cooper_openrlhf.report.replay import alarm_outcome, gap_step_noise, replay_monitor, wrong_reward_course
    from cooper_openrlhf.report.runs import load_run

    args = parse_args(argv)
    cooper = SimpleNamespace(**{k.removeprefix("cooper."): v for k, v in vars(args).items()
                                if k.startswith("cooper." + FLAG_PREFIX)})
    try:
        config = HackingMonitorConfig.from_namespace(cooper)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    print(f"{'run':<40} {'arm':<26} {'seed':>4} {'logged alarms':>13} {'replayed':>8} {'first':>6}  {'rules':<17} "
          f"{'held-out first lowest@step last':>32} {'gap noise':>9} {'wrong paid first peak@step last':>31}")
    unreadable, per_arm = 0, {}
    for run_dir in args.run_dirs:
        run = load_run(run_dir)
        if run.failed or not run.scalars:
            unreadable += 1
            print(f"{Path(run_dir).name:<40} {run.arm:<26} {run.seed:>4}  not readable: {run.error or 'no scalars'}")
            continue
        replay = replay_monitor(run.scalars, config, args.heldout_samples)
        outcome = alarm_outcome(run.scalars, replay.alarm_steps, -math.inf if args.held_at is None else args.held_at)
        heldout, noise, wrong = heldout_series(run.scalars), gap_step_noise(run.scalars), wrong_reward_course(run.scalars)
        per_arm.setdefault(run.arm, []).append((outcome, wrong))
        shown = (f"{heldout[0][1]:.2f} {min(v for _, v in heldout):.2f}@{outcome.lowest_step} {heldout[-1][1]:.2f}"
                 if heldout else "-")
        paid = f"{wrong.first:.2f} {wrong.peak:.2f}@{wrong.peak_step} {wrong.last:.2f}" if wrong else "-"
        first = "-" if outcome.first_alarm is None else outcome.first_alarm
        print(f"{Path(run_dir).name:<40} {run.arm:<26} {run.seed:>4} {len(replay.logged_alarm_steps):>13} "
              f"{len(replay.alarm_steps):>8} {first:>6}  {','.join(replay.rules) or '-':<17} {shown:>32} "
              f"{'-' if noise is None else f'{noise:.3f}':>9} {paid:>31}")
    rise = config.gap_growth
    print("\nper arm (early: before half of the run's held-out fall, first -> lowest, was behind the first alarm; "
          f"a closed episode: the RM's pay for wrong rollouts rose >= {rise:g} above its start, then ended within "
          f"{rise / 2:g} of it)")
    for arm, runs in per_arm.items():
        print(f"{arm}: {_alarm_counts(runs, rise)}" + ("" if args.held_at is None else
              f" | ended >= {args.held_at:g}: {_alarm_counts([r for r in runs if r[0].held], rise)}"
              f" | ended below: {_alarm_counts([r for r in runs if r[0].held is False], rise)}"))
    return 1 if unreadable == len(args.run_dirs) else 0


if __name__ == "__main__":
    sys.exit(main())
