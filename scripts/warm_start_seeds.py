"""The warm start over seeds: where it stops, and how well the policy it leaves answers held-out problems.

The lab's arms all start from one warm-started tiny policy (lab/warm_start.py), stopped once its sampled accuracy
on a probe of train problems reaches the preset's target. Held-out accuracy (problems with no trivially
equivalent twin among the train split) is what the arms are compared on, so a warm start that memorises its sums
leaves the held-out curves no room to fall. This runs the preset's warm start at each (seed, gradient clip), as
`lab.prepare.prepare_policy` does, and scores each policy as it does (`lab.prepare.split_accuracies`), one JSON
line per run; finished runs are reused.

    python scripts/warm_start_seeds.py runs/warm-start-seeds.jsonl --seeds 0,1,2 --clips none,1.0 [--preset quick]
    python scripts/warm_start_seeds.py runs/warm-start-seeds.jsonl --seeds 0 --clips none --target 0.9

--target trains on past the preset's stopping accuracy: whether held-out accuracy follows the train split's up.
"""

import argparse
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("out", type=Path, help="a JSON Lines file, appended to (finished runs are skipped)")
    parser.add_argument("--preset", default="quick", help="the lab preset whose task and warm-start target are used")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--clips", default="none,1.0", help="gradient clips (max norm), 'none' for no clip")
    parser.add_argument("--target", type=float, default=None,
                        help="the sampled train accuracy the warm start stops at (default: the preset's)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # each check
    from cooper_openrlhf.lab.prepare import split_accuracies
    from cooper_openrlhf.lab.presets import PRESETS
    from cooper_openrlhf.lab.task import warm_start_problems
    from cooper_openrlhf.lab.warm_start import WarmStartConfig, fine_tune
    from cooper_openrlhf.models import model_path

    preset = PRESETS[args.preset]
    target = args.target if args.target is not None else preset.warm_start_accuracy
    clips = [None if c.strip() == "none" else float(c) for c in args.clips.split(",")]
    plan = [(seed, clip, target) for clip in clips for seed in map(int, args.seeds.split(","))]
    done = set()
    if args.out.is_file():
        done = {(r["seed"], r["max_grad_norm"], r["target_accuracy"])
                for r in map(json.loads, args.out.read_text().splitlines())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for seed, clip, target in tqdm([p for p in plan if p not in done], desc="warm starts", unit="run"):
        config = WarmStartConfig(target_accuracy=target, temperature=preset.temperature, seed=seed, max_grad_norm=clip)
        started = time.perf_counter()
        model, tokenizer, result = fine_tune(str(model_path("tiny-qwen2-policy")), warm_start_problems(preset.task),
                                             config, preset.task.prompt_suffix)
        row = {"seed": seed, "max_grad_norm": clip, "target_accuracy": target, **asdict(result),
               **split_accuracies(model, tokenizer, preset), "seconds": round(time.perf_counter() - started, 1)}
        with args.out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    rows = [json.loads(line) for line in args.out.read_text().splitlines()]
    print("| target | clip | seed | steps | train accuracy | held-out accuracy |\n|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["target_accuracy"], r["max_grad_norm"] or 0, r["seed"])):
        print(f"| {r['target_accuracy']} | {r['max_grad_norm'] or 'none'} | {r['seed']} | {r['steps']} | "
              f"{r['train_accuracy']:.2f} | {r['heldout_accuracy']:.2f} |")


if __name__ == "__main__":
    main()
