"""Which file each `--benchmarks` entry means, and its questions, checked before anything is generated.

An entry is either a known benchmark name, read from the data folder in its public format
(`data.benchmarks.BENCHMARKS`), or ``name=path`` for any JSON Lines / parquet file: a known name
with no explicit keys keeps its public format, anything else is read as a generic question/answer
file (`data.benchmarks.load_qa_file`). Nothing is downloaded.
"""

from dataclasses import dataclass
from pathlib import Path

from cooper_openrlhf.data.benchmarks import BENCHMARKS, BenchmarkFormatError, load_benchmark, load_qa_file
from cooper_openrlhf.data.records import MathProblem
from cooper_openrlhf.verify.extract import normalize_answer

# Benchmarks of the paper's evaluation (VerifyBench is a verifier benchmark, not a policy one).
EVAL_BENCHMARKS = tuple(name for name in BENCHMARKS if name != "verifybench")
# Where a known benchmark may sit under the data folder, tried in order.
DATA_DIR_LAYOUTS = ("{name}/test.jsonl", "{name}.jsonl", "{name}/test.parquet", "{name}.parquet")


class BenchmarkSpecError(ValueError):
    """A `--benchmarks` entry that names no readable file."""


@dataclass(frozen=True)
class BenchmarkSpec:
    """One benchmark to evaluate. keys: (question key, answer key) for a generic file, None for a public format."""

    name: str
    path: Path
    keys: tuple[str, str] | None


def parse_benchmark_specs(
    text: str, data_dir: str | Path | None, question_key: str | None = None, answer_key: str | None = None
) -> list[BenchmarkSpec]:
    """Comma-separated entries -> specs; raises BenchmarkSpecError naming the entry and what was tried."""
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    if not entries:
        raise BenchmarkSpecError("no benchmarks given")
    unknown = [entry for entry in entries if "=" not in entry and entry not in EVAL_BENCHMARKS]
    if unknown:
        raise BenchmarkSpecError(
            f"unknown benchmark {unknown[0]!r}; valid: {list(EVAL_BENCHMARKS)}, or name=path.jsonl|.parquet for any file"
        )
    explicit_keys = question_key is not None or answer_key is not None
    generic_keys = (question_key or "question", answer_key or "answer")
    specs = []
    for entry in entries:
        name, sep, path_text = entry.partition("=")
        name = name.strip()
        if sep:
            path = Path(path_text.strip()).expanduser()
            if not path.is_file():
                raise BenchmarkSpecError(f"benchmark {name!r}: file {path} does not exist")
            keys = None if name in EVAL_BENCHMARKS and not explicit_keys and path.suffix == ".jsonl" else generic_keys
            specs.append(BenchmarkSpec(name, path, keys))
            continue
        if data_dir is None:
            raise BenchmarkSpecError(f"benchmark {name!r} needs --data-dir (or give it as {name}=path)")
        candidates = [Path(data_dir) / layout.format(name=name) for layout in DATA_DIR_LAYOUTS]
        found = next((path for path in candidates if path.is_file()), None)
        if found is None:
            raise BenchmarkSpecError(f"benchmark {name!r}: none of {[str(p) for p in candidates]} exists")
        specs.append(BenchmarkSpec(name, found, None if found.suffix == ".jsonl" else generic_keys))
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise BenchmarkSpecError(f"benchmark names must be unique, got {names}")
    return specs


def load_problems(spec: BenchmarkSpec, limit: int | None = None) -> list[MathProblem]:
    """The first `limit` questions of `spec` (all when None); every reference must be a non-empty answer."""
    if spec.keys is None:
        problems = load_benchmark(spec.name, spec.path).records
        if not problems:
            raise BenchmarkFormatError(f"{spec.path}: no questions in the file")
    else:
        problems = load_qa_file(spec.path, *spec.keys, source=spec.name).records
    for problem in problems:
        if normalize_answer(problem.reference) is None:
            raise BenchmarkFormatError(f"{spec.path}:{problem.index + 1}: the reference answer is empty")
    return problems[:limit] if limit is not None else problems
