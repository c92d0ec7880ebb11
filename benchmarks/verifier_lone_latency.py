"""A lone sample's rule verification through `VerifierPool`, as the reward service pays it at concurrency 1.

The service verifies each sample in a pool worker while the RM scores it. At concurrency 1 the worker sleeps
between samples, so each verification follows a pause. This measures the pool's round trip for one fresh sample
(math-verify caches parses, so no sample is verified twice) in three conditions:

- back to back: the previous verification has just returned;
- after an idle pause as long as the tiny RM's lone forward (this process sleeps);
- after that forward (this process runs it, one thread, as the service's scorer does at concurrency 1).

Conditions take turns block by block in a rotating order, so drift in the machine's load falls on all three alike.
Each condition's figure is the median over blocks of the block's median round trip; each ratio is the median over
blocks of the two medians in the same block. The tiny RM's lone forward is printed beside them for scale.

    python benchmarks/verifier_lone_latency.py [--rm DIR] [--blocks 12] [--samples 40]

Readings and what they mean for the service: docs/serve.md ("What the gap is made of").
"""

import argparse
import itertools
import statistics
import time

from cooper_openrlhf.models import model_path
from cooper_openrlhf.rm.model import load_rm, score_logits, usable_max_length
from cooper_openrlhf.runtime import install_cpu_runtime
from cooper_openrlhf.verify.pool import VerifierPool

CONDITIONS = ("back to back", "after an idle pause", "after a forward")


def sample(i: int) -> tuple[str, str, str]:
    """(question, reference, completion) of fresh sample i: numbers no other i shares."""
    a, b = 1000 + 7 * i, 13 + i % 89
    return f"What is {a} + {b}?", str(a + b), f"First, {a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rm", default=None, help="an RM folder (default: the install's tiny Qwen2 RM)")
    parser.add_argument("--blocks", type=int, default=12, help="blocks per condition, in rotating order")
    parser.add_argument("--samples", type=int, default=40, help="lone verifications per block")
    args = parser.parse_args()

    install_cpu_runtime()
    import torch  # after the package, which silences torch's import-time warnings

    torch.set_num_threads(1)  # the service's scorer at concurrency 1 (docs/serve.md, threads per batch)
    model, tokenizer, template_version = load_rm(args.rm or model_path("tiny-qwen2-rm"))
    max_length = usable_max_length(model)

    def forward(i: int) -> None:
        question, reference, completion = sample(i)
        score_logits(model, tokenizer, [question], [reference], [completion], max_length=max_length,
                     template_version=template_version, batch_size=1)

    for i in range(30):  # warm-up
        forward(-1 - i)
    start = time.perf_counter()
    for i in range(100):
        forward(-100 - i)
    forward_s = (time.perf_counter() - start) / 100

    next_sample = itertools.count()
    by_condition = {name: [] for name in CONDITIONS}
    with VerifierPool(num_workers=1) as pool:
        def lone(i: int) -> float:
            _, reference, completion = sample(i)
            began = time.perf_counter()
            pool.verify_batch([reference], [completion])
            return time.perf_counter() - began

        for _ in range(20):  # warm-up: the worker's imports and first parses
            lone(next(next_sample))
        for block in range(args.blocks + 1):  # block 0 is a warm-up round of each condition
            order = CONDITIONS[block % 3:] + CONDITIONS[:block % 3]
            for name in order:
                times = []
                for _ in range(args.samples):
                    i = next(next_sample)
                    if name == "after an idle pause":
                        time.sleep(forward_s)
                    elif name == "after a forward":
                        forward(-10**6 - i)
                    times.append(lone(i))
                if block:
                    by_condition[name].append(statistics.median(times))

    print(f"tiny RM lone forward, one thread: {forward_s * 1e3:.2f} ms")
    base = by_condition["back to back"]
    for name in CONDITIONS:
        medians = by_condition[name]
        ratio = statistics.median(m / b for m, b in zip(medians, base))
        print(f"{name:20s} round trip {statistics.median(medians) * 1e3:.3f} ms "
              f"(blocks {min(medians) * 1e3:.3f}-{max(medians) * 1e3:.3f}), {ratio:.2f}x back to back")


if __name__ == "__main__":
    main()
