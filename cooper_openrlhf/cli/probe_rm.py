"""Probe reward models: what would a policy maximising each RM write?

    cooper inspect probe-rm RM... [--preset full]   # = python -m cooper_openrlhf.cli.probe_rm

Scores lab/rm_probe.py's candidate outputs (right, wrong, answerless, hedged answers in the preset's policy's
answer sentence, and every constant answer) on the preset's RL prompts and prints, per RM, the one-line verdict
and a table per kind; with `--accuracy A` also the climb on offer to a policy right on A of the prompts (what the
lab's pair stage chooses by), and with `--require-answer` as the format gate pays (answerless text 0). The
lab runs the same probe on its starting RM (verifyrm/probe.json, lab.json); this command probes any RM folder,
for instance a Cooper run's co-trained RM (`<run>/final/rm`) or a candidate starting RM before a lab is run.
"""

import argparse
import json
import sys
from pathlib import Path

from cooper_openrlhf.lab.presets import PRESETS


PROG = "cooper inspect probe-rm"  # `python -m cooper_openrlhf.cli.probe_rm` runs the same command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("rm", nargs="+", type=Path, help="reward-model folder(s) (a VerifyRM export)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full", help="whose prompts and answer sentence")
    parser.add_argument("--json", type=Path, default=None, help="also write the records here")
    parser.add_argument("--accuracy", type=float, default=None,
                        help="also print the climb on offer to a policy right on this share of the prompts (0-1)")
    parser.add_argument("--require-answer", action="store_true",
                        help="score as --cooper.require_answer pays: answerless text 0")
    args = parser.parse_args(argv)
    if args.accuracy is not None and not 0.0 <= args.accuracy <= 1.0:
        parser.error(f"--accuracy must be in [0, 1], got {args.accuracy}")
    missing = [str(p) for p in args.rm if not (p / "config.json").is_file()]
    if missing:
        parser.error(f"not a model folder (no config.json): {', '.join(missing)}")
    from cooper_openrlhf.lab.pair_stage import climb_on_offer
    from cooper_openrlhf.lab.prepare import probe_preset_rm
    from cooper_openrlhf.lab.rm_probe import format_kinds

    preset = PRESETS[args.preset].with_overrides(require_answer=args.require_answer or None)
    records = []
    for rm in args.rm:
        record = probe_preset_rm(preset, rm)
        records.append(record)
        climb = ("" if args.accuracy is None else
                 f"climb on offer at {args.accuracy:.0%}: {climb_on_offer(record, args.accuracy):+.3f}\n")
        print(f"{rm}: {record['verdict']}\n{climb}{format_kinds(record['kinds'])}\n", flush=True)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
