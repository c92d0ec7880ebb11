"""Write figures and tables of training runs.

    cooper report RUN_DIR [RUN_DIR ...] --out DIR   # = python -m cooper_openrlhf.cli.report

Each RUN_DIR is one run (one arm, one seed), read recursively: tensorboard event files from OpenRLHF's
logger and, when present, `--cooper.sample_log_dir`'s rollouts.jsonl / pairs.jsonl. Arm and seed come from
RUN_DIR/run_info.json, else a folder name `<arm>_seed<k>`, else the folder name (seed 0). Writes into DIR
the figures of `report/figures.py`, report.md and summary.json, and prints what each arm of the given runs
logged, first -> last (`report/build.py` `run_lines`; a lab's reading against the paper and its committed batches
are `cooper lab`'s last lines, not this command's). A run without event
files is listed as failed and the others still render; the command fails only when no run could be read at
all. `--publish DEST` copies the report to commit: every figure small, no path of this machine
(report/publish.py).
See docs/report.md for how to read the figures.
"""

import argparse
import logging
import sys
from pathlib import Path

logger = logging.getLogger("cooper_openrlhf.report")


PROG = "cooper report"  # `python -m cooper_openrlhf.cli.report` runs the same command


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="One folder per run (arm and seed).")
    parser.add_argument("--out", required=True, help="Folder for the figures, report.md and summary.json.")
    parser.add_argument("--publish", type=Path, default=None, metavar="DEST",
                        help="Also copy the report into DEST to commit (docs/results/<name>): every figure it shows as a "
                             "small PNG, paths under the current folder written relative to it (report/publish.py).")
    parser.add_argument("--publish-with", type=Path, action="append", default=[], metavar="FILE",
                        help="With --publish: also copy this record (a lab's lab.json), paths made relative the same way. "
                             "Repeatable.")
    parser.add_argument("--style", default=None, metavar="S",
                        help="The style lab's answer sentence (lab/presets.py STYLE, a plan's \"style\"), e.g. "
                             "'The answer is {other}. The answer is {answer}.': adds exploit_rate.png, the share of "
                             "each step's rollouts written in S and the share in S and verified wrong.")
    args = parser.parse_args(argv)
    if args.style is not None and "{answer}" not in args.style:
        parser.error(f"--style {args.style!r}: an answer sentence needs an {{answer}} field")
    missing = [str(path) for path in args.publish_with if not path.is_file()]
    if args.publish_with and args.publish is None:
        parser.error("--publish-with needs --publish DEST")
    if missing:
        parser.error(f"--publish-with: no such file: {', '.join(missing)}")
    return args


def write_report(run_dirs: list[str], out: Path, style: str | None = None):
    """`report.build.write_report` with the lab's arms keeping their colours in every report."""
    from cooper_openrlhf.lab.arms import ARMS
    from cooper_openrlhf.report.build import write_report as build

    return build(run_dirs, out, known_arms=ARMS, style=style)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    runs = write_report(args.run_dirs, Path(args.out), args.style)
    from cooper_openrlhf.report.build import run_lines

    print("\n".join(run_lines(runs)), flush=True)  # what these runs logged, nothing of the lab's own batches
    if args.publish:
        from cooper_openrlhf.report.publish import publish_report

        print(f"published: {args.publish}: " + ", ".join(p.name for p in publish_report(Path(args.out), args.publish,
                                                                                       root=Path.cwd(),
                                                                                       extra=args.publish_with)), flush=True)
    if all(run.failed for run in runs):
        logger.error("no run could be read; the report lists why")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
