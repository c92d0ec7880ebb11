"""Evaluation results as a text table (stdout), markdown and JSON files."""

import json
from pathlib import Path

from cooper_openrlhf.eval.metrics import average_over_benchmarks
from cooper_openrlhf.eval.runner import BenchmarkResult

_COLUMNS = ("benchmark", "questions", "k", "avg@k (%)", "+- SE", "pass@k (%)", "no answer (%)")


def _rows(results: list[BenchmarkResult]) -> list[tuple[str, ...]]:
    rows = [
        (r.name, str(r.score.questions), str(r.score.k), f"{100 * r.score.avg_at_k:.1f}", f"{100 * r.score.avg_at_k_se:.1f}",
         f"{100 * r.score.pass_at_k:.1f}", f"{100 * r.score.no_answer_share:.1f}")
        for r in results
    ]
    average = average_over_benchmarks([r.score for r in results])
    rows.append(("average", "", "", f"{100 * average['avg_at_k']:.1f}", f"{100 * average['avg_at_k_se']:.1f}",
                 f"{100 * average['pass_at_k']:.1f}", f"{100 * average['no_answer_share']:.1f}"))
    return rows


def text_table(results: list[BenchmarkResult]) -> str:
    rows = [_COLUMNS, *_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def markdown_table(results: list[BenchmarkResult]) -> str:
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(results)]
    return "\n".join(lines)


def write_report(out_dir: Path, results: list[BenchmarkResult], config: dict, wall_s: float) -> tuple[Path, Path]:
    """results.json and results.md in `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "config": config,
        "benchmarks": {r.name: r.to_dict() for r in results},
        "average": average_over_benchmarks([r.score for r in results]),
        "wall_seconds": round(wall_s, 2),
    }
    json_path, md_path = out_dir / "results.json", out_dir / "results.md"
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    settings = ", ".join(f"{key}={config[key]}" for key in ("model", "protocol", "k", "temperature", "top_p", "max_new_tokens")
                         if key in config)
    md_path.write_text(f"# Evaluation\n\n{settings}\n\n{markdown_table(results)}\n\n"
                       "avg@k: mean accuracy over samples (bootstrap SE over questions); pass@k: unbiased estimator; "
                       "no answer: samples with no extractable final answer.\n", encoding="utf-8")
    return json_path, md_path
