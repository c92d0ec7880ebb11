"""GPU memory per role from parameter counts, optimizer state and KV-cache arithmetic (docs/cluster.md).

`cooper inspect sizing` prints the estimates docs/cluster.md quotes. Estimates, not
measurements: CUDA context, NCCL buffers and fragmentation add a few GB per GPU.
"""

import argparse
from dataclasses import dataclass

GB, GIB = 1e9, 2**30


@dataclass(frozen=True)
class Shape:
    """What the arithmetic needs from a model's config.json (and its parameter count)."""

    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int


QWEN25_1_5B = Shape(1.54e9, 28, 1536, 2, 128, 151_936)
QWEN25_7B = Shape(7.62e9, 28, 3584, 4, 128, 152_064)


def zero2_train_bytes(params: float, gpus: int) -> float:
    """bf16 weights on every GPU + partitioned bf16 grads and fp32 master/Adam m/v (ZeRO: 2P + (2 + 12)P/D)."""
    return 2 * params + 14 * params / gpus


def logits_peak_bytes(shape: Shape, micro: int, seq: int) -> float:
    """fp32 logits of a micro-batch, twice at the log-softmax peak."""
    return 2 * micro * seq * shape.vocab * 4


def checkpoint_bytes(shape: Shape, micro: int, seq: int) -> float:
    """Gradient-checkpointed layer inputs (bf16)."""
    return shape.layers * micro * seq * shape.hidden * 2


def kv_bytes_per_token(shape: Shape) -> int:
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * 2


def report(policy: Shape, actor_gpus: int, engines: int, seq: int = 1024, micro: int = 4, rollout_micro: int = 16,
           sequences: int = 2048) -> list[str]:
    actor = zero2_train_bytes(policy.params, actor_gpus) + checkpoint_bytes(policy, micro, seq) + \
        logits_peak_bytes(policy, micro, seq)
    reference = 2 * policy.params + logits_peak_bytes(policy, rollout_micro, seq)
    kv_needed = sequences / engines * seq * kv_bytes_per_token(policy)
    kv_budget = 0.8 * 80 * GB - 2 * policy.params - 3 * GB
    return [
        f"actor on {actor_gpus} GPUs: {actor / GB:.1f} GB; + colocated reference (micro {rollout_micro}): "
        f"{(actor + reference) / GB:.1f} GB",
        f"reference alone: {reference / GB:.1f} GB",
        f"KV cache: {kv_bytes_per_token(policy) / 1024:.0f} KiB/token; per engine ({engines}) "
        f"{kv_needed / GIB:.1f} GiB needed of ~{kv_budget / GIB:.0f} GiB at 0.8 x 80 GB",
    ]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="cooper inspect sizing", description=__doc__.split("\n\n")[0]).parse_args(argv)
    print("1.5B policy, 1 x 8:", *report(QWEN25_1_5B, 4, 2), sep="\n  ")
    print(f"1.5B VerifyRM trained on 1 GPU: {zero2_train_bytes(QWEN25_1_5B.params, 1) / GB:.1f} GB + activations")
    print("7B policy, 1 x 8:", *report(QWEN25_7B, 4, 2), sep="\n  ")
    print("7B policy, 1 x 8, rollout micro-batch 4:", *report(QWEN25_7B, 4, 2, rollout_micro=4), sep="\n  ")
    print("7B policy, 2 x 8:", *report(QWEN25_7B, 8, 5), sep="\n  ")
    return 0
