"""Do Cooper's negatives show its RM the exploit? The style lab's pairs and wrong rollouts, by form, over a run.

    python scripts/style_pair_forms.py RUN_DIR [RUN_DIR ...] [--windows 1-20,21-60,61-80] [--style S]

Per run and step window (report/negatives.py `style_forms`): the valid pairs, the share whose positive is a hedge,
the share whose negative has the exploit's form (the hedge stating the reference first, a wrong final answer: what
a reference-matching RM pays), and the share of the policy's own wrong rollouts in that form. Then the totals over
the runs. Reads samples/pairs.jsonl and samples/rollouts.jsonl of each run (the archives `cli.batch --publish`
writes hold both). S defaults to the style lab's (lab/presets.py STYLE).
"""

import argparse
import json
from pathlib import Path


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv=None) -> int:
    from cooper_openrlhf.lab.presets import STYLE
    from cooper_openrlhf.report.negatives import style_forms

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--windows", default="1-20,21-60,61-80")
    parser.add_argument("--style", default=STYLE)
    args = parser.parse_args(argv)
    edges = [tuple(int(x) for x in w.split("-")) for w in args.windows.split(",")]
    ratios = (("hedge positives", "positive in S", "pairs"), ("exploit-form negatives", "negative exploit form", "pairs"),
              ("exploit-form wrong rollouts", "wrong rollouts exploit form", "wrong rollouts"))
    print("run | pairs | " + " | ".join(f"{name} {lo}-{hi}" for name, _, _ in ratios for lo, hi in edges))
    total: dict[tuple[int, int], dict[str, int]] = {edge: {} for edge in edges}
    for run in args.runs:
        pairs = run / "samples" / "pairs.jsonl"
        forms = style_forms(_rows(pairs) if pairs.is_file() else [], _rows(run / "samples" / "rollouts.jsonl"),
                            args.style)
        windows = {}
        for lo, hi in edges:
            summed: dict[str, int] = {}
            for step, counts in forms.items():
                if lo <= step <= hi:
                    for key, value in counts.items():
                        summed[key] = summed.get(key, 0) + value
                        total[(lo, hi)][key] = total[(lo, hi)].get(key, 0) + value
            windows[(lo, hi)] = summed
        print(f"{run.name} | {sum(w.get('pairs', 0) for w in windows.values())} | " + " | ".join(
            _share(windows[edge], num, den) for _, num, den in ratios for edge in edges))
    print(f"all {len(args.runs)} | {sum(w.get('pairs', 0) for w in total.values())} | " + " | ".join(
        _share(total[edge], num, den) for _, num, den in ratios for edge in edges))
    return 0


def _share(counts: dict[str, int], numerator: str, denominator: str) -> str:
    return f"{counts.get(numerator, 0) / counts[denominator]:.2f}" if counts.get(denominator) else "-"


if __name__ == "__main__":
    raise SystemExit(main())
