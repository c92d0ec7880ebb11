"""The co-trained RM on its training pairs (rewrites) against pairs of the policy's own rollouts, over a run.

    python scripts/rewrite_vs_rollout_negatives.py RUN_DIR [RUN_DIR ...] [--windows 1-10,11-40,41-70,71-80]

Per run and per step window: the RM's accuracy on the step's rewrite pairs (`cooper/rm_pair_accuracy`), on pairs of
the step's own rollouts (report/negatives.py `rollout_pair_accuracy`), what it pays the verified-right and -wrong
rollouts,
and the share of wrong rollouts that are a well-formed answer sentence ("The answer is N.", what every rewrite
is). Then the mean over the runs. Reads tensorboard/ and samples/rollouts.jsonl of each run (the archives
`cli.batch --publish` writes hold both).
"""

import argparse
import json
import logging
import re
import statistics
from pathlib import Path

WELL_FORMED = re.compile(r"^The answer is -?\d+\.$")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--windows", default="1-10,11-40,41-70,71-80")
    args = parser.parse_args(argv)
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    from cooper_openrlhf.algo.metric_keys import CORRECT_REWARD, PAIR_ACCURACY, WRONG_REWARD
    from cooper_openrlhf.ray.run_logs import read_scalars
    from cooper_openrlhf.report.negatives import rollout_pair_accuracy, window_means

    edges = [tuple(int(x) for x in w.split("-")) for w in args.windows.split(",")]
    columns = ("rewrite pairs", "own-rollout pairs", "pay for right", "pay for wrong", "wrong well-formed")
    totals: dict[str, list[list[float]]] = {c: [] for c in columns}
    print("run | " + " | ".join(f"{c} {lo}-{hi}" for c in columns for lo, hi in edges))
    for run in args.runs:
        rows = [json.loads(line) for line in (run / "samples" / "rollouts.jsonl").read_text().splitlines() if line]
        scalars = read_scalars(run / "tensorboard")
        own = {s: acc for s, (acc, _) in rollout_pair_accuracy(rows).items()}
        wrong = [r for r in rows if not r["verified"]]
        formed: dict[int, list[bool]] = {}
        for r in wrong:
            formed.setdefault(int(r["step"]), []).append(bool(WELL_FORMED.match(r["completion"].strip())))
        series = {"rewrite pairs": dict(scalars.get(PAIR_ACCURACY, [])), "own-rollout pairs": own,
                  "pay for right": dict(scalars.get(CORRECT_REWARD, [])),
                  "pay for wrong": dict(scalars.get(WRONG_REWARD, [])),
                  "wrong well-formed": {s: sum(v) / len(v) for s, v in formed.items()}}
        cells = []
        for c in columns:
            means = window_means(series[c], edges)
            totals[c].append(means)
            cells += ["-" if m is None else f"{m:.2f}" for m in means]
        print(f"{run.name} | " + " | ".join(cells))
    mean_cells = []
    for c in columns:
        for i in range(len(edges)):
            values = [m[i] for m in totals[c] if m[i] is not None]
            mean_cells.append(f"{statistics.fmean(values):.2f}" if values else "-")
    print(f"mean of {len(args.runs)} | " + " | ".join(mean_cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
