"""One report from run folders: read the runs, draw the figures, write report.md and summary.json.

The library behind `cli.report` and the lab's own report (`cli.lab`); neither CLI calls the other.
"""

import logging
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from cooper_openrlhf.report.figures import write_figures
from cooper_openrlhf.report.markdown import write_markdown
from cooper_openrlhf.report.rm_health import write_rm_health
from cooper_openrlhf.report.robustness import write_robustness
from cooper_openrlhf.report.runs import RunData, load_run

logger = logging.getLogger("cooper_openrlhf.report")


def write_report(run_dirs: Sequence[str], out: Path, known_arms: Sequence[str] = (),
                 style: str | None = None) -> list[RunData]:
    """Read the runs, write the figures, report.md and summary.json into `out`; returns the runs. known_arms: arms
    whose colour is fixed in every report (the lab's); style: the lab's answer sentence S, for the exploit-rate
    figure."""
    runs = [load_run(path, style) for path in tqdm(run_dirs, desc="reading runs", unit="run")]
    for run in runs:
        if run.failed:
            logger.warning("run %s (%s seed %d) failed: %s", run.path, run.arm, run.seed, run.error)
    figures = write_figures(runs, out, known_arms=known_arms, style=style)
    robustness = write_robustness(runs, out)  # only runs that saved their RM (`<tag>_rm_hf`)
    if robustness is not None:
        figures.append(robustness)
    figures += [path for path in [write_rm_health(runs, out, known_arms)] if path]  # runs the RM guard measured
    report, summary = write_markdown(runs, figures, out)
    print(f"report: {report}\nsummary: {summary}\nfigures: " + ", ".join(str(p) for p in figures), flush=True)
    return runs
