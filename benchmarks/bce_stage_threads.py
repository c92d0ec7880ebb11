"""The lab's BCE stage (the starting VerifyRM's training) with one thread, as an arm's processes run, and with every
core, as the preparation runs it now (`lab.prepare.bce_stage_environment`), in one run: per round the same command
(`lab.prepare.bce_stage_argv`, the preset's settings, `--epochs` epochs) each way, order alternating, each into a
fresh folder. Run it on an otherwise idle machine: beside other work a second thread has no core to use.

    python benchmarks/bce_stage_threads.py LAB_DIR [--preset quick] [--epochs 1] [--rounds 2]

LAB_DIR: a prepared lab folder (its data/rm_triples.jsonl), e.g. runs/lab-quick after `make demo`.
"""

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lab", type=Path)
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from cooper_openrlhf.lab.prepare import bce_stage_argv, bce_stage_environment
    from cooper_openrlhf.lab.presets import PRESETS

    data = args.lab / "data" / "rm_triples.jsonl"
    if not data.is_file():
        parser.error(f"{data}: no such file (prepare the lab first: python -m cooper_openrlhf.cli.lab --prepare-only)")
    every_core = bce_stage_environment()
    ways = {"one thread (an arm's processes)": {**every_core, "OMP_NUM_THREADS": "1"},
            f"every core ({os.cpu_count()}, the preparation)": every_core}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for round_index in range(args.rounds):
        for name in (list(ways) if round_index % 2 == 0 else list(reversed(ways))):
            with tempfile.TemporaryDirectory() as scratch:
                argv = bce_stage_argv(PRESETS[args.preset], data, Path(scratch) / "verifyrm", epochs=args.epochs)
                start = time.perf_counter()
                subprocess.run(argv, env=ways[name], check=True, capture_output=True)
                times[name].append(time.perf_counter() - start)
            print(f"round {round_index + 1}: {name}: {times[name][-1]:.1f} s", flush=True)
    one, every = (statistics.median(times[name]) for name in ways)
    for name in ways:
        print(f"{name:40s} median {statistics.median(times[name]):6.1f} s over {args.rounds}")
    print(f"BCE stage, one thread / every core: {one / every:.2f}x")


if __name__ == "__main__":
    main()
