"""What the service's per-sample verification deadline costs: `serve/verification.py` `SharedLanes` (each answer its
own dispatch through the shared worker pools, so a slow answer holds no other) against each lane verifying its
batch on its own pool in one call (the service's way before the deadline), on the same answers and workers.

    python benchmarks/verifier_lanes.py [--answers 1024] [--batch 32] [--repeats 2]

Prints, per way and repeat (interleaved: the machine may be shared), answers verified per second and the CPU this
process (the service's side: dispatch, futures, pipes) spends per answer; the workers' CPU is the same either way.
Answers are short sums, as the lab's policy writes them ("... The answer is \\boxed{N}."), one in three wrong.
"""

import argparse
import concurrent.futures
import time

from cooper_openrlhf.serve.verification import SharedLanes
from cooper_openrlhf.verify.pool import VerifierPool

LANES = 2  # as cli.serve: two verifier lanes, one single-worker pool each


def answers(count: int) -> tuple[list[str], list[str]]:
    references = [str(i % 97) for i in range(count)]
    completions = [f"Adding them gives {i % 97}. The answer is \\boxed{{{i % 97 + (i % 3 == 0)}}}." for i in range(count)]
    return references, completions


def per_lane_batches(references, completions, batch: int, deadline_s: float) -> tuple[float, float]:
    pools = [VerifierPool(num_workers=1, deadline_s=deadline_s) for _ in range(LANES)]
    try:
        with concurrent.futures.ThreadPoolExecutor(LANES) as lanes:
            wall, cpu = time.perf_counter(), time.process_time()
            futures = [lanes.submit(pools[k % LANES].verify_batch, references[i:i + batch], completions[i:i + batch])
                       for k, i in enumerate(range(0, len(references), batch))]
            for future in futures:
                future.result()
            return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        for pool in pools:
            pool.close()


def shared_lanes(references, completions, batch: int, deadline_s: float) -> tuple[float, float]:
    lanes = SharedLanes([VerifierPool(num_workers=1, deadline_s=deadline_s) for _ in range(LANES)], deadline_s, LANES)
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        futures = []
        for i in range(0, len(references), batch):
            futures += lanes.verify(references[i:i + batch], completions[i:i + batch])
        for future in futures:
            future.result()
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        lanes.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32, help="answers per lane call (the batcher's batch)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--deadline", type=float, default=5.0)
    args = parser.parse_args()
    references, completions = answers(args.answers)
    cpu_by_way: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, way in (("batch per lane", per_lane_batches), ("shared lanes", shared_lanes)):
            wall, cpu = way(references, completions, args.batch, args.deadline)
            cpu_by_way.setdefault(name, []).append(1000 * cpu / args.answers)
            print(f"{name:>14}: {args.answers / wall:7.0f} answers/s, this process's CPU {1000 * cpu / args.answers:.3f} "
                  f"ms per answer", flush=True)
    best = {name: min(values) for name, values in cpu_by_way.items()}
    print(f"shared lanes / batch per lane, this process's CPU per answer (best of {args.repeats}): "
          f"{best['shared lanes'] / best['batch per lane']:.2f}x")


if __name__ == "__main__":  # the pools' workers start by forkserver: they import this module, which must not run
    main()
