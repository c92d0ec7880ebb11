"""`cli.serve` whose RM forward is a latency-bound stand-in: a wait per batch, as a GPU forward costs, and no CPU.

    python benchmarks/stand_in_forward_serve.py --forward-ms 50 [--per-sample-ms 0.2] <cli.serve arguments>

`serve_throughput.py`'s servers under `--stand-in-forward-ms`. On a CPU machine the RM's forward takes the cores
the rest of the service needs, so more scoring replicas cannot show what they bring where each has a GPU of its own.
Here the forward is the only part replaced: `rm.model.score_logits` still renders and tokenizes every sample (CPU
work a GPU node does too) and calls the model, which sleeps `forward_ms` per micro-batch (plus `per_sample_ms` per
row) and returns a deterministic logit per row; the HTTP app, Serve's proxy, the ingress, the registry, the rule
verifier and the bookkeeping are the real ones. The RM given by `--rm` is loaded as usual (its tokenizer, template
and length are read from it) and its weights are then dropped.

The seam is the scorer each place builds: the one-process service's `serve.build.served_scorer`, and with
`--replicas` the scoring deployment's class (`serve.replicated.launch.Scorer`), replaced by a subclass that swaps
the forward after the real `__init__`. The subclass is made in a function, so Ray pickles it by value and the
replicas need no path to this file. A benchmark's tool, never a reward service: its rewards are not an RM's.
"""

import argparse
import sys
import time
import zlib

from cooper_openrlhf.cli import serve as cli_serve  # before torch: the OpenMP wait policy `cooper serve` runs under

import torch  # noqa: E402


class LatencyBoundForward(torch.nn.Module):
    """A one-logit classifier's call as `rm.model.rm_logits` makes it: sleeps `forward_s + per_sample_s * rows`,
    then returns (rows, 1) logits in [-4, 4), a function of each row's tokens alone (the same text, the same logit).
    `sleep`: what waits (the tests pass a recorder)."""

    def __init__(self, forward_s: float, per_sample_s: float = 0.0, sleep=time.sleep):
        super().__init__()
        self.forward_s, self.per_sample_s, self.sleep = forward_s, per_sample_s, sleep
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # where rm_logits reads the device

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        rows = input_ids.shape[0]
        self.sleep(self.forward_s + self.per_sample_s * rows)
        tokens = (input_ids * attention_mask).tolist()
        codes = [zlib.crc32(str(row).encode()) / 2**32 for row in tokens]  # in [0, 1)
        return torch.tensor(codes, dtype=torch.float32, device=self.anchor.device).unsqueeze(-1) * 8 - 4


def stand_in_forward(rm, forward_ms: float, per_sample_ms: float = 0.0, sleep=time.sleep):
    """`rm` (an `rm.scorer.RMScorer`) with every version it holds scored by a `LatencyBoundForward`; returns `rm`.
    No thread choice: a GPU forward's speed does not depend on the CPU's threads (as `RMScorer` does on a GPU)."""
    forward = LatencyBoundForward(forward_ms / 1000, per_sample_ms / 1000, sleep)
    forward.eval()
    rm.models = {version: forward for version in rm.versions()}
    rm.threads = None
    return rm


def stand_in_scorer_class(forward_ms: float, per_sample_ms: float = 0.0):
    """The scoring deployment's class (`serve.replicated.scoring.Scorer`) with the stand-in forward."""
    from cooper_openrlhf.serve.replicated.scoring import Scorer

    class StandInScorer(Scorer):
        def __init__(self, args, registry):
            super().__init__(args, registry)
            stand_in_forward(self.rm, forward_ms, per_sample_ms)

    return StandInScorer


def install(forward_ms: float, per_sample_ms: float = 0.0) -> None:
    """Both hosts of the service in this process build their scorer with the stand-in forward."""
    import cooper_openrlhf.serve.build as build
    import cooper_openrlhf.serve.replicated.launch as launch

    served_scorer = build.served_scorer
    build.served_scorer = lambda args: stand_in_forward(served_scorer(args), forward_ms, per_sample_ms)
    launch.Scorer = stand_in_scorer_class(forward_ms, per_sample_ms)  # what `launch.deploy` deploys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--forward-ms", type=float, required=True, help="the stand-in forward's wait per micro-batch")
    p.add_argument("--per-sample-ms", type=float, default=0.0, help="and per row of it")
    own, rest = p.parse_known_args(argv)
    if "--learn" in rest:  # an RM update would load trained weights into the stand-in
        sys.exit("stand_in_forward_serve.py: learning off only (the stand-in has no weights to train)")
    install(own.forward_ms, own.per_sample_ms)
    return cli_serve.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
