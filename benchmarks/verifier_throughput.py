"""Rule-verifier throughput: serial in-process `verify_one` vs `VerifierPool`, on real GSM8K + MATH500 answers.

Items: each problem's reference written as a short solution ending in \\boxed{reference}
(correct), plus one wrong answer per problem (integer references + 1, others the next problem's
reference). Three sections, each timed --repeats times with serial and pool runs interleaved
(the machine is shared: compare within a row, read ranges across rows):

1. the first --limit problems of gsm8k/test + math500/test, in order (the two answers to a
   problem adjacent, as the rollouts of a prompt are);
2. the same items shuffled;
3. the first --math500-limit problems of math500/test alone, where sympy work dominates.

Each row: verifications per second for both ways, their ratio, p50/p99/max latency, and, per
item, CPU microseconds (serial: this process; pool: its dispatcher + its workers) and
microseconds spent runnable but waiting for a CPU (serial: this process; pool: its workers),
both from /proc/<pid>/schedstat. CPU per item hardly depends on how busy the machine is: a pool
whose CPU per item matches serial's reaches about num_workers x serial when it has the cores to
itself. The waits show when it did not (other users' processes; with Linux's autogroup
scheduling all processes of one session share one session's CPU share). Each section starts by
measuring that ceiling: how much more work num_workers busy processes get done than one, now.
Caches are warm (one untimed pass per section first): the serial process then holds every
reference's parse, each pool worker only those it saw.
Reads ../shared/data beside the checkout (or --data). Figures and what they mean for a Cooper step:
docs/verifier_pool.md.

    python benchmarks/verifier_throughput.py [--workers N] [--deadline S] [--limit N] [--math500-limit N] [--repeats R]
"""

import argparse
import logging
import multiprocessing as mp
import os
import random
import statistics
import time
from pathlib import Path

from cooper_openrlhf.data.benchmarks import load_benchmark
from cooper_openrlhf.verify.pool import VerifierPool
from cooper_openrlhf.verify.rule import Verdict, verify_one

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def build_items(problems: list) -> tuple[list[str], list[str]]:
    references, completions = [], []
    for i, problem in enumerate(problems):
        reference = problem.reference
        next_reference = problems[(i + 1) % len(problems)].reference
        wrong = str(int(reference) + 1) if reference.lstrip("-").isdigit() else next_reference
        for answer in (reference, wrong):
            references.append(reference)
            completions.append(
                f"Let us work it out step by step.\nCombining the steps, the answer is \\boxed{{{answer}}}."
            )
    return references, completions


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def schedstat(pids: list[int]) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting) of these single-threaded processes so far.

    None where /proc has no schedstat (not Linux).
    """
    try:
        fields = [Path(f"/proc/{pid}/schedstat").read_text().split() for pid in pids]
        return sum(int(f[0]) for f in fields) / 1e9, sum(int(f[1]) for f in fields) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def per_item_us(before: tuple | None, after: tuple | None, count: int) -> list[float] | None:
    if before is None or after is None:
        return None
    return [1e6 * (a - b) / count for a, b in zip(after, before)]


def run_serial(references: list[str], completions: list[str]) -> dict:
    latencies, verdicts = [], []
    sched_start, start = schedstat([os.getpid()]), time.perf_counter()
    for reference, completion in zip(references, completions):
        item_start = time.perf_counter()
        verdicts.append(verify_one(reference, completion).verdict)
        latencies.append(time.perf_counter() - item_start)
    seconds = time.perf_counter() - start
    cpu, wait = per_item_us(sched_start, schedstat([os.getpid()]), len(references)) or (None, None)
    return {"seconds": seconds, "latencies": latencies, "verdicts": verdicts, "cpu": cpu, "wait": wait}


def run_pool(pool: VerifierPool, references: list[str], completions: list[str]) -> dict:
    pids = pool.worker_pids
    dispatcher_start, workers_start = schedstat([os.getpid()]), schedstat(pids)
    result = pool.verify_batch(references, completions)
    count = len(references)
    dispatcher = per_item_us(dispatcher_start, schedstat([os.getpid()]), count)
    # A worker replaced during the batch (none should be) takes its counters with it.
    workers = per_item_us(workers_start, schedstat(pids), count) if pool.worker_pids == pids else None
    cpu, wait = (dispatcher[0] + workers[0], workers[1]) if dispatcher and workers else (None, None)
    return {
        "seconds": result.wall_seconds,
        "latencies": result.latency_seconds,
        "verdicts": result.verdicts,
        "cpu": cpu,
        "wait": wait,
    }


def check_verdicts(references: list[str], completions: list[str], serial: list, pooled: list) -> None:
    """Serial and pool must agree, except where math-verify's own alarm (TIMEOUT) fired on one side only."""
    differ = [i for i, (a, b) in enumerate(zip(serial, pooled)) if a != b]
    timeouts = [i for i in differ if Verdict.TIMEOUT in (serial[i], pooled[i])]
    if timeouts:
        print(f"note: {len(timeouts)} item(s) timed out on one side only (math-verify's alarm, a busy machine)")
    wrong = [i for i in differ if i not in timeouts]
    if wrong:
        details = "; ".join(f"item {i} {references[i]!r} vs {completions[i][-60:]!r}: serial {serial[i].value}, "
                            f"pool {pooled[i].value}" for i in wrong[:5])
        raise SystemExit(f"serial and pool verdicts differ on {len(wrong)} item(s): {details}")


def spin(seconds: float) -> int:
    """Busy-loop for `seconds` of wall time; return the iterations done (the work this process got)."""
    end, iterations = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        iterations += 1
    return iterations


def parallel_capacity(processes: int, seconds: float = 0.5) -> float:
    """Work done by `processes` busy processes at once, in units of one busy process's work: the pool's ceiling now."""
    with mp.get_context("spawn").Pool(processes) as spinners:
        alone = spinners.apply(spin, (seconds,))
        together = sum(spinners.map(spin, [seconds] * processes, chunksize=1))
    return together / alone


def ms(seconds: float) -> str:
    return f"{1000 * seconds:7.2f}"


def us(value: float | None) -> str:
    return f"{value:6.0f}" if value is not None else "   n/a"


def compare(title: str, pool: VerifierPool, references: list[str], completions: list[str], repeats: int) -> list[float]:
    """Time serial and pool `repeats` times, interleaved; print one row per repeat; return the ratios."""
    count = len(references)
    run_serial(references, completions)  # warm-up, untimed
    pool.verify_batch(references, completions)
    capacity = parallel_capacity(pool.num_workers)
    print(
        f"-- {title}: {count} verifications; ceiling now: {pool.num_workers} busy processes get {capacity:.2f}x "
        f"the work of one"
    )
    print(
        f"{'':>3} {'serial/s':>9} {'pool/s':>9} {'ratio':>6} | {'serial p50':>10} {'p99':>7} {'max':>7} | "
        f"{'pool p50':>8} {'p99':>7} {'max':>7} ms | us/item: CPU serial   pool  wait serial  pool"
    )
    ratios, cpu_ratios = [], []
    for repeat in range(repeats):
        serial = run_serial(references, completions)
        pooled = run_pool(pool, references, completions)
        check_verdicts(references, completions, serial["verdicts"], pooled["verdicts"])
        serial_rate, pool_rate = count / serial["seconds"], count / pooled["seconds"]
        ratios.append(pool_rate / serial_rate)
        if serial["cpu"] and pooled["cpu"]:
            cpu_ratios.append(pooled["cpu"] / serial["cpu"])
        print(
            f"{repeat + 1:>3} {serial_rate:9.0f} {pool_rate:9.0f} {ratios[-1]:6.2f} | "
            f"{ms(percentile(serial['latencies'], 50)):>10} {ms(percentile(serial['latencies'], 99))} "
            f"{ms(max(serial['latencies']))} | {ms(percentile(pooled['latencies'], 50)):>8} "
            f"{ms(percentile(pooled['latencies'], 99))} {ms(max(pooled['latencies']))} ms | "
            f"{us(serial['cpu']):>17} {us(pooled['cpu'])} {us(serial['wait']):>11} {us(pooled['wait'])}"
        )
    counts: dict[str, int] = {}
    for verdict in serial["verdicts"]:
        counts[verdict.value] = counts.get(verdict.value, 0) + 1
    cpu_summary = f"; CPU per item pool/serial {min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}" if cpu_ratios else ""
    print(
        f"pool/serial throughput ratio: {min(ratios):.2f}-{max(ratios):.2f} (median {statistics.median(ratios):.2f})"
        f"{cpu_summary}; verdicts {counts}"
    )
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--workers", type=int, default=None, help="pool workers (default: CPU count)")
    parser.add_argument("--deadline", type=float, default=5.0, help="pool hard deadline per item, seconds")
    parser.add_argument("--limit", type=int, default=None, help="sections 1-2: the first N problems (default: all)")
    parser.add_argument(
        "--math500-limit", type=int, default=200, help="section 3: the first N MATH500 problems (0: skip)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed serial/pool pairs per section")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    gsm8k = load_benchmark("gsm8k", args.data / "gsm8k" / "test.jsonl").records
    math500 = load_benchmark("math500", args.data / "math500" / "test.jsonl").records
    mixed = (gsm8k + math500)[: args.limit] if args.limit else gsm8k + math500
    references, completions = build_items(mixed)
    order = list(range(len(references)))
    random.Random(0).shuffle(order)

    with VerifierPool(num_workers=args.workers, deadline_s=args.deadline) as pool:
        print(
            f"pool of {pool.num_workers} workers, deadline {args.deadline} s, {len(os.sched_getaffinity(0))} CPUs, "
            f"load average {os.getloadavg()[0]:.1f}; one right and one wrong answer per problem; warm caches"
        )
        sources = "gsm8k/test" if len(mixed) <= len(gsm8k) else "gsm8k/test + math500/test"
        compare(f"{len(mixed)} problems of {sources}, in order", pool, references, completions, args.repeats)
        compare(
            "the same, shuffled (no reference repeats nearby)",
            pool,
            [references[i] for i in order],
            [completions[i] for i in order],
            args.repeats,
        )
        if args.math500_limit:
            heavy = math500[: args.math500_limit]
            compare(f"{len(heavy)} problems of math500/test (sympy-heavy)", pool, *build_items(heavy), args.repeats)


if __name__ == "__main__":
    main()
