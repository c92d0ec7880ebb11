"""`python -m cooper_openrlhf.cli.rollouts RUN_DIR... [--steps 38-40] [--top 3]`: what each run's policy wrote.

Per run, over the steps given (default: the last three logged): rollouts, mean RM reward, verified share, mean
reward of verified and of unverified rollouts, the most common completions and the highest-paid rollouts
(report/rollouts.py). RUN_DIR holds a `rollouts.jsonl` (train_cooper's --cooper.sample_log_dir), as for cli.report;
with --heldout, the held-out evaluations' rollouts instead (`heldout.jsonl`: reward is what the RM paid them).
"""

import argparse
import sys
from pathlib import Path


def _steps(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    try:
        window = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps takes N or N-M, got {text!r}") from None
    if window[0] > window[1]:
        raise argparse.ArgumentTypeError(f"--steps {text}: the first step comes after the last")
    return window


def main(argv: list[str] | None = None) -> int:
    from cooper_openrlhf.report.rollouts import rollout_window
    from cooper_openrlhf.report.runs import iter_rollouts

    parser = argparse.ArgumentParser(prog="python -m cooper_openrlhf.cli.rollouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--steps", type=_steps, default=None, help="N or N-M (default: the last three logged steps)")
    parser.add_argument("--top", type=int, default=3, help="completions listed per run")
    parser.add_argument("--heldout", action="store_true",
                        help="read the held-out evaluations' rollouts (heldout.jsonl), steps = evaluation steps")
    args = parser.parse_args(argv)
    show = lambda value: "-" if value is None else f"{value:.3f}"  # noqa: E731
    for run_dir in args.run_dirs:
        name = "heldout.jsonl" if args.heldout else "rollouts.jsonl"
        found = sorted(run_dir.rglob(name))
        if not found:
            parser.error(f"{run_dir}: no {name} (was the run started with --cooper.sample_log_dir"
                         f"{' and --eval.dataset' if args.heldout else ''}?)")
        rows = list(iter_rollouts(found[0]))
        last = max(row["step"] for row in rows) if rows else 0
        first, last = args.steps or (last - 2, last)
        try:
            w = rollout_window(rows, first, last, args.top)
        except ValueError as exc:
            parser.error(f"{run_dir}: {exc}")
        print(f"{run_dir} steps {w.first}-{w.last}: {w.rollouts} rollouts, mean reward {show(w.mean_reward)}, "
              f"verified {w.verified:.2f}, reward verified {show(w.reward_verified)} / unverified {show(w.reward_unverified)}")
        print("  most common: " + ", ".join(f"{text!r} ({count})" for text, count in w.common))
        print("  highest paid: " + ", ".join(f"{text!r} {reward:.2f}{' (right)' if ok else ''}"
                                             for text, reward, ok in w.best_paid))
    return 0


if __name__ == "__main__":
    sys.exit(main())
