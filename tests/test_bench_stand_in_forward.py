"""`serve_throughput.py --stand-in-forward-ms`: the stand-in forward in the RM scorer, and how the benchmark reaches it."""

import argparse
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """The benchmark scripts as modules (the folder is no package)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("stand_in_forward_serve"), importlib.import_module("serve_throughput")


def items(count: int) -> list[tuple]:
    return [(0, f"What is {k} + 2?", str(k + 2), f"First, {k} + 2 = {k + 2}. The answer is {k + 2}.")
            for k in range(count)]


def test_the_stand_in_waits_per_micro_batch_and_returns_one_logit_per_sample(bench, model_dir):
    from cooper_openrlhf.rm.scorer import RMScorer

    stand_in, _ = bench
    rm = RMScorer.load(model_dir("tiny-qwen2-rm"), batch_size=4)
    waits = []
    assert stand_in.stand_in_forward(rm, 50, per_sample_ms=2, sleep=waits.append) is rm
    logits = rm.logits_of(items(6))
    # two micro-batches of the scorer's batch size, 4 rows then 2, each one wait of 50 ms plus 2 ms a row
    assert sorted(waits) == pytest.approx([0.054, 0.058])
    assert len(logits) == 6 and all(isinstance(x, float) and -4 <= x < 4 for x in logits)
    assert len(set(logits)) == 6  # distinct texts, distinct logits
    assert rm.logits_of(items(6)[::-1]) == logits[::-1]  # a function of the sample, not of its batch or place
    assert rm.threads is None and rm.versions() == {0}


def test_the_forward_has_a_one_logit_classifiers_shape(bench):
    import torch

    stand_in, _ = bench
    waits = []
    forward = stand_in.LatencyBoundForward(0.1, sleep=waits.append)
    ids = torch.tensor([[5, 6, 7], [5, 6, 0]])
    out = forward(input_ids=ids, attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]))
    assert out.shape == (2, 1) and out.dtype == torch.float32 and waits == [0.1]


def test_installed_both_hosts_build_the_stand_in(bench, model_dir, monkeypatch):
    import cooper_openrlhf.serve.build as build
    import cooper_openrlhf.serve.replicated.launch as launch
    from cooper_openrlhf.serve.replicated.scoring import Scorer

    stand_in, _ = bench
    monkeypatch.setattr(build, "served_scorer", build.served_scorer)  # restored after the test
    monkeypatch.setattr(launch, "Scorer", launch.Scorer)
    stand_in.install(forward_ms=0)
    assert issubclass(launch.Scorer, Scorer) and launch.Scorer is not Scorer
    rm = build.served_scorer(argparse.Namespace(rm=model_dir("tiny-qwen2-rm"), dtype="fp32", rm_max_length=0,
                                                max_batch=8))
    assert isinstance(rm.models[0], stand_in.LatencyBoundForward) and len(rm.logits_of(items(3))) == 3


def test_learning_is_refused(bench):
    stand_in, _ = bench
    with pytest.raises(SystemExit, match="learning off only"):
        stand_in.main(["--forward-ms", "10", "--rm", "x", "--learn"])


def test_the_benchmark_starts_its_servers_behind_the_stand_in_when_asked(bench):
    _, throughput = bench
    args = argparse.Namespace(stand_in_forward_ms=None, stand_in_per_sample_ms=0.0)
    assert throughput.cooper_command(args)[1:] == ["-m", "cooper_openrlhf.cli.serve"]
    args.stand_in_forward_ms, args.stand_in_per_sample_ms = 50.0, 0.5
    command = throughput.cooper_command(args)
    assert Path(command[1]) == BENCHMARKS / "stand_in_forward_serve.py"
    assert command[2:] == ["--forward-ms", "50.0", "--per-sample-ms", "0.5"]
    args.max_batch = 64
    assert throughput.stand_in_bound(args) == pytest.approx(64 / (0.05 + 64 * 0.0005))
