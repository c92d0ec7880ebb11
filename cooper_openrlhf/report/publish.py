"""A report made fit to commit (docs/results/<name>/): every figure it shows, small; no path of this machine.

`cli.report` and `cli.lab` write a report next to the runs, with full-colour figures and each run's path as
this machine knows it. A committed copy is read elsewhere, so `publish_report` copies report.md with every
figure it links to (palette PNGs: a line plot needs few colours, and one is a quarter of the size), the
report's summary.json and any `extra` record (the lab's lab.json), writing every path under `root` relative
to it. A figure the report links to but lacks is an error, never a broken link in docs.
"""

import re
from collections.abc import Sequence
from pathlib import Path

FIGURE_LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")
PALETTE_COLOURS = 64  # 32 merged tab10's blue into grey where bands overlap; 64 keeps every arm's colour


def figure_links(markdown: str) -> list[str]:
    """The PNG files a markdown text shows, in order, each once."""
    return list(dict.fromkeys(FIGURE_LINK.findall(markdown)))


def small_png(source: Path, target: Path, colours: int = PALETTE_COLOURS) -> None:
    """`source` as a palette PNG of `colours` colours (median cut, no dithering: flat lines stay flat)."""
    from PIL import Image

    with Image.open(source) as image:
        palette = image.convert("RGB").quantize(colors=colours, method=Image.Quantize.MEDIANCUT,
                                                 dither=Image.Dither.NONE)
    palette.save(target, optimize=True)


def relative_paths(text: str, root: Path) -> str:
    """`text` with every occurrence of the absolute folder `root` written relative to it ("root/x" -> "x")."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    return text.replace(prefix, "")


def publish_report(report_dir: Path, dest: Path, *, root: Path, extra: Sequence[Path] = ()) -> list[Path]:
    """Copy `report_dir`'s report.md, the figures it links and summary.json, and the `extra` text files (JSON,
    markdown) into `dest`, figures made small and paths under `root` made relative to it; returns the files written."""
    report = report_dir / "report.md"
    texts = [report, report_dir / "summary.json", *extra]
    absent = [str(path) for path in texts if not path.is_file()]
    if absent:
        raise FileNotFoundError(f"nothing to publish from {report_dir}: no {', '.join(absent)} (run cli.report or cli.lab first)")
    figures = figure_links(report.read_text(encoding="utf-8"))
    missing = [name for name in figures if not (report_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{report} links figures that are not in {report_dir}: {', '.join(missing)}")
    dest.mkdir(parents=True, exist_ok=True)
    for name in figures:
        small_png(report_dir / name, dest / name)
    for source in texts:
        (dest / source.name).write_text(relative_paths(source.read_text(encoding="utf-8"), root), encoding="utf-8")
    return [dest / name for name in figures] + [dest / source.name for source in texts]
