"""One benchmark's evaluation: generate (through the cache) -> grade with the rule verifier pool -> summarize.

Protocols (`PROTOCOLS`, chosen by name):
  paper   k = 8 samples per question at temperature 0.7, top-p 0.95 (the Cooper paper's avg@8)
  greedy  one greedy sample per question (Qwen2.5-Math's evaluation)

Generation goes in batches of questions; each finished batch is appended to the benchmark's
cache before the next starts, so a killed run loses at most one batch. Grading runs over all
cached completions at the end (it is cheap next to generation: see benchmarks/eval_throughput.py).
An empty completion is graded like any other: no answer, counted in the no-answer share.
"""

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from tqdm import tqdm

from cooper_openrlhf.runtime.registry import Registry
from cooper_openrlhf.data.records import MathProblem
from cooper_openrlhf.engines.base import GenerationEngine, SamplingConfig
from cooper_openrlhf.eval.cache import GenerationCache
from cooper_openrlhf.eval.metrics import BenchmarkScore, summarize
from cooper_openrlhf.eval.prompts import build_messages
from cooper_openrlhf.verify.rule import Verdict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Protocol:
    """Samples per question and how they are drawn."""

    k: int
    temperature: float
    top_p: float


PROTOCOLS = Registry("protocol", {
    "paper": Protocol(k=8, temperature=0.7, top_p=0.95),
    "greedy": Protocol(k=1, temperature=0.0, top_p=1.0),
})


def get_protocol(name: str) -> Protocol:
    return PROTOCOLS[name]


@dataclass
class BenchmarkResult:
    """A benchmark's score, its verdict counts over all samples, and where the time went."""

    name: str
    score: BenchmarkScore
    verdicts: dict[str, int]
    generated_questions: int  # generated in this run (the rest came from the cache)
    seconds: dict[str, float] = field(default_factory=dict)  # "generate", "grade"

    def to_dict(self) -> dict:
        return {"name": self.name, **self.score.to_dict(), "verdicts": self.verdicts,
                "generated_questions": self.generated_questions, "seconds": self.seconds}


def generate_missing(
    engine: GenerationEngine,
    problems: list[MathProblem],
    sampling: SamplingConfig,
    cache: GenerationCache,
    batch_questions: int,
    desc: str = "generate",
) -> int:
    """Generate every problem not yet in `cache`, a batch at a time; returns how many were generated."""
    if batch_questions < 1:
        raise ValueError(f"batch_questions must be >= 1, got {batch_questions}")
    todo = [p for p in problems if p.index not in cache.completions]
    with tqdm(total=len(problems), initial=len(problems) - len(todo), desc=desc, unit="q", dynamic_ncols=True) as bar:
        for start in range(0, len(todo), batch_questions):
            batch = todo[start : start + batch_questions]
            flat = engine.generate([build_messages(p.question) for p in batch], sampling)
            if len(flat) != len(batch) * sampling.n:
                raise RuntimeError(f"engine returned {len(flat)} completions for {len(batch)} prompts x {sampling.n}")
            cache.append([
                {"index": p.index, "question": p.question, "reference": p.reference,
                 "completions": flat[i * sampling.n : (i + 1) * sampling.n]}
                for i, p in enumerate(batch)
            ])
            bar.update(len(batch))
    return len(todo)


def grade(pool, references: list[str], completions: list[list[str]]) -> tuple[list[list[Verdict]], list[list[str | None]]]:
    """Verdicts and extracted answers per question and sample, from the rule verifier pool.

    pool: a `verify.pool.VerifierPool` (or anything with its `verify_batch`). references[q] is the
    reference of completions[q] (a list of samples).
    """
    if len(references) != len(completions):
        raise ValueError(f"{len(references)} references but {len(completions)} completion lists")
    flat_refs = [ref for ref, samples in zip(references, completions) for _ in samples]
    flat = [text for samples in completions for text in samples]
    result = pool.verify_batch(flat_refs, flat)
    verdicts, extracted, position = [], [], 0
    for samples in completions:
        verdicts.append(result.verdicts[position : position + len(samples)])
        extracted.append(result.extracted[position : position + len(samples)])
        position += len(samples)
    return verdicts, extracted


def score_verdicts(verdicts: list[list[Verdict]], k: int | None = None, seed: int = 0) -> BenchmarkScore:
    """`metrics.summarize` over verdicts: CORRECT counts as correct, NO_ANSWER as no answer (TIMEOUT/ERROR as wrong)."""
    return summarize(
        [[v == Verdict.CORRECT for v in samples] for samples in verdicts],
        [[v == Verdict.NO_ANSWER for v in samples] for samples in verdicts],
        k=k,
        seed=seed,
    )


def evaluate_benchmark(
    name: str,
    problems: list[MathProblem],
    engine: GenerationEngine | None,
    sampling: SamplingConfig,
    cache: GenerationCache,
    pool,
    batch_questions: int = 64,
    seed: int = 0,
) -> BenchmarkResult:
    """Generate what the cache lacks (engine may be None when it lacks nothing), grade, summarize."""
    start = time.perf_counter()
    missing = sum(p.index not in cache.completions for p in problems)
    if missing and engine is None:
        raise ValueError(f"{name}: {missing} questions have no cached generations and no engine was given")
    generated = generate_missing(engine, problems, sampling, cache, batch_questions, desc=name) if missing else 0
    generate_s = time.perf_counter() - start
    completions = [cache.completions[p.index] for p in problems]
    verdicts, _ = grade(pool, [p.reference for p in problems], completions)
    grade_s = time.perf_counter() - start - generate_s
    counts = Counter(v.value for samples in verdicts for v in samples)
    for unusual in (Verdict.TIMEOUT, Verdict.ERROR):
        if counts.get(unusual.value):
            logger.warning("%s: %d samples graded %s (counted as wrong)", name, counts[unusual.value], unusual.value)
    return BenchmarkResult(
        name=name,
        score=score_verdicts(verdicts, k=sampling.n, seed=seed),
        verdicts=dict(sorted(counts.items())),
        generated_questions=generated,
        seconds={"generate": round(generate_s, 3), "grade": round(grade_s, 3)},
    )
