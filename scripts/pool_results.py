"""Pool the final held-out accuracy of published lab reports (docs/results/*/summary.json) per arm.

    python scripts/pool_results.py docs/results/lab-run19 docs/results/lab-run20

Prints per arm: seeds, mean, standard deviation, a 95% bootstrap interval of the mean over seeds (10,000
resamples, seed 0) and how many seeds held (final >= 0.25). "Final" is each report's final value per seed.
"""

import argparse
import json
import random
import statistics
from pathlib import Path

HELD = 0.25  # the lab's line for a policy that kept its accuracy (docs/lab.md)


def pooled_finals(folders: list[Path]) -> dict[str, list[float]]:
    finals: dict[str, list[float]] = {}
    for folder in folders:
        for arm in json.loads((folder / "summary.json").read_text())["arms"]:
            finals.setdefault(arm["arm"], []).extend(arm["final_values"])
    return finals


def bootstrap_interval(values: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="published report folders with a summary.json")
    args = parser.parse_args()
    print("| arm | seeds | final held-out, mean ± sd | 95% bootstrap CI | held (>= 0.25) |\n|---|---|---|---|---|")
    for arm, values in sorted(pooled_finals(args.folders).items(), key=lambda item: -statistics.fmean(item[1])):
        low, high = bootstrap_interval(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        held = sum(value >= HELD for value in values)
        print(f"| {arm} | {len(values)} | {statistics.fmean(values):.3f} ± {sd:.3f} | [{low:.3f}, {high:.3f}] | "
              f"{held} of {len(values)} |")


if __name__ == "__main__":
    main()
