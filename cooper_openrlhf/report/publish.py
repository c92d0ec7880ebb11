"""A report made fit to commit (docs/results/<name>/): every figure it shows, small; no path of this machine.

`cli.report` and `cli.lab` write a report next to the runs, with full-colour figures and each run's path as
this machine knows it. A committed copy is read elsewhere, so `publish_report` copies report.md with every
figure it links to (palette PNGs: a line plot needs few colours, and one is under a third of the size), the
report's summary.json and any `extra` record (the lab's lab.json), writing every path under `root` relative
to it. A figure the report links to but lacks is an error, never a broken link in docs.
"""

import re
from collections.abc import Sequence
from pathlib import Path

FIGURE_LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")
PALETTE_COLOURS = 64  # 32 merged tab10's blue into grey where bands overlap; white, black and the arms' 18 among
# them (`arm_palette`), so 44 median-cut colours for the rest


def figure_links(markdown: str) -> list[str]:
    """The PNG files a markdown text shows, in order, each once."""
    return list(dict.fromkeys(FIGURE_LINK.findall(markdown)))


def arm_palette() -> list[tuple[int, int, int]]:
    """The colours the figures give arms (report/figures.py `arm_colours`: its PALETTE, then tab10's others), as
    8-bit RGB."""
    import matplotlib

    from cooper_openrlhf.report.figures import PALETTE

    hexes = PALETTE + [h for h in (matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab10"].colors)
                       if h not in PALETTE]
    return [tuple(round(255 * v) for v in matplotlib.colors.to_rgb(h)) for h in hexes]


def small_png(source: Path, target: Path, colours: int = PALETTE_COLOURS) -> None:
    """`source` as a palette PNG of `colours` colours, each pixel the nearest of them (no dithering: flat lines stay
    flat). White, black and the arms' colours are always in the palette and kept exact: median cut alone merges a
    colour drawn on few pixels (an arm's panel title) into a neighbour's, and one arm's title came out in another
    arm's colour. Pillow's own mapping onto a given palette is approximate (white became 253, 253, 252), so the
    nearest entry is found here, once per distinct colour."""
    import numpy as np
    from PIL import Image

    keep = [(255, 255, 255), (0, 0, 0), *arm_palette()]  # the page, its text, the arms
    with Image.open(source) as image:
        rgb = image.convert("RGB")
    adaptive = rgb.quantize(colors=colours - len(keep), method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    found = np.array(adaptive.getpalette()[:3 * (colours - len(keep))], dtype=np.int64).reshape(-1, 3)
    palette = np.concatenate([found, np.array(keep, dtype=np.int64)])
    pixels = np.asarray(rgb, dtype=np.int64).reshape(-1, 3)
    distinct, which = np.unique(pixels, axis=0, return_inverse=True)
    nearest = ((distinct[:, None, :] - palette[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)
    indexed = Image.fromarray(nearest[which.reshape(-1)].astype(np.uint8).reshape(rgb.height, rgb.width), mode="P")
    indexed.putpalette(palette.astype(np.uint8).flatten().tolist())
    indexed.save(target, optimize=True)


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
