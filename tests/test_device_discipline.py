"""Device discipline: the code that runs inside GPU actors, run here with its inputs "on CUDA".

`fake_cuda.FakeCuda` (tests/fake_cuda.py) labels tensors as cuda:0 and fails a call that mixes labelled and
unlabelled tensors, as a CUDA kernel does; a GPU user's first crash becomes a failing test on this CPU machine.
"""

import pytest
import torch

from cooper_openrlhf.algo.losses import bce_rm_loss, pairwise_rm_loss
from cooper_openrlhf.algo.pairs import PairBatch
from fake_cuda import FakeCuda


def test_the_fake_fails_a_mixed_device_call_and_follows_device_of():
    fake = FakeCuda()
    with fake:
        logits = fake.put(torch.randn(4))
        assert logits.device.type == "cuda"
        with pytest.raises(RuntimeError, match="same device"):
            logits * torch.ones(4)
        follows = torch.ones(4, device=logits.device)
        assert fake.on_cuda(follows) and fake.on_cuda(logits * follows)
        moved = torch.ones(4).to(logits)
        assert fake.on_cuda(moved) and not fake.on_cuda((logits * moved).cpu())
        assert fake.on_cuda(logits * torch.tensor(2.0))  # a 0-dim CPU scalar may meet a CUDA tensor


@pytest.mark.parametrize("with_mask", [False, True])
def test_losses_keep_to_the_device_of_their_logits(with_mask):
    fake = FakeCuda()
    with fake:
        pos, neg = fake.put(torch.randn(5, requires_grad=True)), fake.put(torch.randn(5))
        valid = fake.put(torch.tensor([True, True, False, True, False]))
        loss, metrics = pairwise_rm_loss(pos, neg, valid)
        assert fake.on_cuda(loss) and metrics["valid"] == 3
        loss.backward()
        labels = fake.put(torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0]))
        loss, _ = bce_rm_loss(pos, labels, valid if with_mask else None)
        assert fake.on_cuda(loss)
        with pytest.raises(RuntimeError, match="same device"):  # a CPU mask with CUDA logits is the caller's bug
            pairwise_rm_loss(pos, neg, torch.ones(5, dtype=torch.bool))


def _bare_rm_trainer(model_dir):
    """An `rm.pairwise_update.RMTrainer` around a plain tiny RM (no DeepSpeed engine: only the loss is run)."""
    from cooper_openrlhf.rm.model import load_rm
    from cooper_openrlhf.rm.pairwise_update import RMTrainer

    model, tokenizer, version = load_rm(str(model_dir("tiny-qwen2-rm")))
    return RMTrainer(None, model, None, None, tokenizer, 128, version, micro_batch_size=4)


def test_rm_update_micro_loss_runs_with_the_rm_on_cuda(model_dir):
    """Every RM update on GPU (the RM actor's and the reward service's): the pair mask must be made on the logits'
    device (a CPU mask crashed here)."""
    from cooper_openrlhf.rm.pairwise_update import _micro_loss

    trainer = _bare_rm_trainer(model_dir)
    pairs = PairBatch(questions=["1+1?", "2+2?"], references=["2", "4"], positives=["The answer is 2.", "It is 4."],
                      negatives=["The answer is 3.", "It is 5."], valid=[True, True], positive_index=[0, 4],
                      negative_source=["assistant", "rollout"])
    sums = torch.zeros(7, dtype=torch.float64)
    fake = FakeCuda()
    with fake:
        fake.put(trainer.model)
        loss = _micro_loss(trainer, pairs, [0, 1], sums)
        assert fake.on_cuda(loss) and loss.requires_grad
    assert sums[4] == 1 and sums[6] == 1  # one pair counted per negative source


class _FakeNccl:
    """torch.distributed.all_reduce as NCCL behaves: CUDA tensors only (one rank: the sum is the tensor)."""

    def __init__(self, fake: FakeCuda):
        self.fake, self.calls = fake, 0

    def __call__(self, tensor, op=None, group=None, async_op=False):
        if not self.fake.on_cuda(tensor):
            raise RuntimeError("ProcessGroupNCCL: Tensors must be CUDA and dense")
        self.calls += 1


def _nccl_strategy(monkeypatch, fake):
    """An OpenRLHF DeepspeedStrategy of one rank whose collectives meet a fake NCCL and whose device is cuda:0."""
    import openrlhf.utils.deepspeed.deepspeed as ds_module
    from openrlhf.utils.deepspeed import DeepspeedStrategy

    nccl = _FakeNccl(fake)
    monkeypatch.setattr(ds_module.dist, "all_reduce", nccl)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    strategy = DeepspeedStrategy.__new__(DeepspeedStrategy)
    strategy.world_size = 1
    return strategy, nccl


def test_verifyrm_training_log_means_go_through_the_strategy_to_the_collectives_device(monkeypatch):
    """Every VerifyRM training on GPU: the log window's mean over ranks is all-reduced on the device NCCL needs
    (a CPU float64 tensor was handed to dist.all_reduce directly)."""
    from cooper_openrlhf.rm.bce_train import _mean_over_ranks

    fake = FakeCuda()
    strategy, nccl = _nccl_strategy(monkeypatch, fake)
    with fake:
        assert _mean_over_ranks(strategy, [0.5, 0.25, 0.75]) == pytest.approx(0.5)
    assert nccl.calls == 1


@pytest.mark.slow
def test_the_assistant_engines_device_settings_are_decided_where_the_engine_runs(ray_cluster):
    """The dedicated assistant's GPU decision was made inside the pair actor, which holds no GPU, so a GPU run got
    the CPU settings. It is now asked in the engine's own bundle: on this CPU cluster's logical GPUs, no CUDA."""
    from ray.util.placement_group import placement_group, remove_placement_group

    from cooper_openrlhf.ray.pair_actor import assistant_engine_options
    from cooper_openrlhf.runtime.ray_cluster import bundle_has_cuda

    group = placement_group([{"GPU": 1, "CPU": 1}], strategy="PACK")
    ray_cluster.get(group.ready())
    try:
        assert bundle_has_cuda(group) is False
    finally:
        remove_placement_group(group)
    gpu, cpu = assistant_engine_options(True, 0, 4096), assistant_engine_options(False, 0, 4096)
    assert (gpu["enforce_eager"], gpu["enable_prefix_caching"]) == (False, True)
    assert (cpu["enforce_eager"], cpu["enable_prefix_caching"]) == (True, False)
