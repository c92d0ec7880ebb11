"""Show what each run's policy wrote: rewards, verified share, the commonest and highest-paid rollouts.

    cooper inspect rollouts RUN_DIR... [--steps 38-40] [--top 3]   # = python -m cooper_openrlhf.cli.rollouts

Per run, over the steps given (default: the last three logged): rollouts, mean RM reward, verified share, mean
reward of verified and of unverified rollouts, the most common completions and the highest-paid rollouts
(report/rollouts.py). RUN_DIR holds a `rollouts.jsonl` (train_cooper's --cooper.sample_log_dir), as for cli.report;
with --heldout, the held-out evaluations' rollouts instead (`heldout.jsonl`: reward is what the RM paid them).

--export FILE also writes the window's rollouts of every RUN_DIR (every logged step unless --steps is given) as
labelled triples, labelled by the rule verifier's logged verdict: `--export-format recipe` (default) for
`verifyrm train`, `verifybench` for `cli.eval_verifier` -- an RM trained on or measured against what the
policy really wrote.
"""

import argparse
import json
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


PROG = "cooper inspect rollouts"  # `python -m cooper_openrlhf.cli.rollouts` runs the same command


def main(argv: list[str] | None = None) -> int:
    from cooper_openrlhf.report.rollouts import EXPORT_FORMATS, rollout_triples, rollout_window
    from cooper_openrlhf.ray.run_logs import iter_rollouts

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--steps", type=_steps, default=None, help="N or N-M (default: the last three logged steps)")
    parser.add_argument("--top", type=int, default=3, help="completions listed per run")
    parser.add_argument("--heldout", action="store_true",
                        help="read the held-out evaluations' rollouts (heldout.jsonl), steps = evaluation steps")
    parser.add_argument("--export", type=Path, metavar="FILE",
                        help="also write the rollouts as labelled triples (JSON Lines; every logged step unless --steps)")
    parser.add_argument("--export-format", choices=EXPORT_FORMATS, default="recipe",
                        help="recipe: verifyrm train's rows (label); verifybench: cli.eval_verifier's rows (gold_correct)")
    args = parser.parse_args(argv)
    exported = []
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
        print("  most common wrong: " + ", ".join(f"{text!r} ({count}) paid {show(reward)}"
                                                  for text, count, reward in w.common_wrong))
        if args.export:
            window = args.steps or (min(row["step"] for row in rows), last)
            try:
                exported += rollout_triples(rows, *window, fmt=args.export_format, source=str(run_dir))
            except ValueError as exc:
                parser.error(f"{found[0]}: {exc}")
    if args.export:
        args.export.parent.mkdir(parents=True, exist_ok=True)
        args.export.write_text("".join(json.dumps(row) + "\n" for row in exported), encoding="utf-8")
        label = "label" if args.export_format == "recipe" else "gold_correct"
        correct = sum(bool(row[label]) for row in exported)
        print(f"exported {len(exported)} rollouts ({correct} verified) of {len(args.run_dirs)} run(s) to {args.export}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
