"""Rule-verifier throughput: serial in-process `verify_one` vs `VerifierPool`, on real GSM8K + MATH500 answers.

Items: every reference of gsm8k/test and math500/test written as a short solution ending in
\\boxed{reference} (correct), plus one wrong answer per problem (integer references + 1, others
the next problem's reference). Prints verifications per second, p50/p99 latency for both ways,
and the pool/serial throughput ratio, after one untimed warm-up pass on both sides, twice: items
in order (the two answers to a problem adjacent, as the rollouts of a prompt are) and shuffled.
Reads ../shared/data beside the checkout (or --data).

    python benchmarks/verifier_throughput.py [--workers N] [--deadline S] [--limit N]
"""

import argparse
import logging
import os
import random
import statistics
import time
from pathlib import Path

from cooper_openrlhf.data.benchmarks import load_benchmark
from cooper_openrlhf.verify.pool import VerifierPool
from cooper_openrlhf.verify.rule import verify_one

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def build_items(data_dir: Path, limit: int | None) -> tuple[list[str], list[str]]:
    problems = load_benchmark("gsm8k", data_dir / "gsm8k" / "test.jsonl").records
    problems += load_benchmark("math500", data_dir / "math500" / "test.jsonl").records
    problems = problems[:limit] if limit else problems
    references, completions = [], []
    for i, problem in enumerate(problems):
        reference = problem.reference
        wrong = str(int(reference) + 1) if reference.lstrip("-").isdigit() else problems[(i + 1) % len(problems)].reference
        for answer in (reference, wrong):
            references.append(reference)
            completions.append(f"Let us work it out step by step.\nCombining the steps, the answer is \\boxed{{{answer}}}.")
    return references, completions


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def report(name: str, count: int, seconds: float, latencies: list[float]) -> float:
    rate = count / seconds
    print(
        f"{name:<8} items={count:<6} seconds={seconds:7.2f}  verifications/s={rate:8.1f}  "
        f"p50={1000 * percentile(latencies, 50):7.2f} ms  p99={1000 * percentile(latencies, 99):7.2f} ms  "
        f"max={1000 * max(latencies):7.2f} ms"
    )
    return rate


def run_serial(references: list[str], completions: list[str]) -> tuple[float, list[float], list]:
    latencies, verdicts = [], []
    start = time.perf_counter()
    for reference, completion in zip(references, completions):
        item_start = time.perf_counter()
        verdicts.append(verify_one(reference, completion).verdict)
        latencies.append(time.perf_counter() - item_start)
    return time.perf_counter() - start, latencies, verdicts


def compare(title: str, pool: VerifierPool, references: list[str], completions: list[str]) -> None:
    serial_seconds, serial_latencies, serial_verdicts = run_serial(references, completions)
    result = pool.verify_batch(references, completions)
    print(f"-- {title}")
    serial_rate = report("serial", len(references), serial_seconds, serial_latencies)
    pool_rate = report(f"pool x{pool.num_workers}", len(references), result.wall_seconds, result.latency_seconds)
    print(f"pool/serial throughput ratio: {pool_rate / serial_rate:.2f}")
    print(f"verdicts: { {v.value: n for v, n in sorted(result.counts.items())} }")
    if serial_verdicts != result.verdicts:
        raise SystemExit("serial and pool verdicts differ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--workers", type=int, default=None, help="pool workers (default: CPU count)")
    parser.add_argument("--deadline", type=float, default=5.0, help="pool hard deadline per item, seconds")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N problems")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    references, completions = build_items(args.data, args.limit)
    order = list(range(len(references)))
    random.Random(0).shuffle(order)

    with VerifierPool(num_workers=args.workers, deadline_s=args.deadline) as pool:
        # Steady state, as in a long RL run: one untimed pass warms sympy's and ANTLR's caches on both sides.
        run_serial(references, completions)
        pool.verify_batch(references, completions)
        print(f"{len(references)} verifications: {len(references) // 2} problems (gsm8k/test + math500/test), one right "
              f"and one wrong answer each; warm caches; deadline {args.deadline} s; {len(os.sched_getaffinity(0))} CPUs")
        compare("in order (the two answers to a problem are adjacent, as rollouts of a prompt are)", pool, references, completions)
        compare("shuffled (no reference repeats nearby)", pool, [references[i] for i in order], [completions[i] for i in order])


if __name__ == "__main__":
    main()
