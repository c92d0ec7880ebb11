"""Plot and tabulate the lab's arms against the size of the starting RM's blind spot.

    cooper inspect blindspot LAB [LAB ...] --out DIR   # = python -m cooper_openrlhf.cli.blindspot

Each LAB is a lab folder (runs/<lab>, or a committed docs/results/<lab>) whose starting RM differs from the
others' and nothing else: for example the folders `scripts/lab_blindspot_sweep.sh` makes, one per pair-stage
candidate (`cli.lab --rm-candidate K`), beside the default lab (the blindest candidate) and labs run with `--rm`.
Writes DIR/blindspot.png (each arm's final held-out accuracy against the starting RM's climb on offer) and
DIR/blindspot.md (the same as a table), and prints the table. lab/blindspot.py says what the climb is.
"""

import argparse
import sys
from pathlib import Path


PROG = "cooper inspect blindspot"  # `python -m cooper_openrlhf.cli.blindspot` runs the same command


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", nargs="+", metavar="LAB", help="lab folders (each with lab.json and its report)")
    parser.add_argument("--out", type=Path, required=True, help="folder for blindspot.png and blindspot.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from cooper_openrlhf.lab.blindspot import figure, markdown_table, sweep

    try:
        points = sweep(args.labs)
    except (FileNotFoundError, ValueError) as exc:
        print(f"cli.blindspot: {exc}", file=sys.stderr)
        return 2
    table = markdown_table(points)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "blindspot.md").write_text(table, encoding="utf-8")
    figure(points, args.out / "blindspot.png")
    print(table + f"\nfigure: {args.out / 'blindspot.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
