"""Device discipline: the code that runs inside GPU actors, run here with its inputs "on CUDA".

`fake_cuda.FakeCuda` (tests/fake_cuda.py) labels tensors as cuda:0 and fails a call that mixes labelled and
unlabelled tensors, as a CUDA kernel does; a GPU user's first crash becomes a failing test on this CPU machine.
"""

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

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


def _bare_reward_actor(model_dir):
    """A TrainableRewardModelActor's Python object around a plain tiny RM (no Ray, no DeepSpeed engine)."""
    from cooper_openrlhf.ray.reward_actor import TrainableRewardModelActor
    from cooper_openrlhf.rm.model import load_rm

    actor = TrainableRewardModelActor.__ray_metadata__.modified_class.__new__(
        TrainableRewardModelActor.__ray_metadata__.modified_class)
    actor.model, actor.tokenizer, actor.template_version = load_rm(str(model_dir("tiny-qwen2-rm")))
    actor.max_length = 128
    return actor


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


class _Float64Sizes(TorchDispatchMode):
    """Records the size (elements) of the largest float64 tensor any torch op makes while active: every tensor
    is allocated through the dispatcher, so a whole-weight float64 copy cannot escape it."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float64:
                self.largest = max(self.largest, tensor.numel())
        return out


def test_the_rms_rank_weight_check_makes_no_float64_copy_of_a_whole_weight(model_dir, monkeypatch):
    """After every RM update the ranks' weights are compared by (sum, sum of squares) in float64, and
    that made two float64 copies of every weight (`w.double().square()`): 3.7 GB transient for a 1.5B RM's
    embedding. The same statistic is now summed over slices of at most MOMENT_CHUNK elements (set small here, below
    the tiny RM's largest weight): the same value as the whole-tensor sums, no float64 tensor above a slice."""
    from cooper_openrlhf.ray import reward_actor

    actor = _bare_reward_actor(model_dir)
    actor.strategy = SimpleNamespace(all_gather=lambda tensor: tensor)  # one rank: the gather is the tensor
    weights = [p.detach() for p in actor.model.parameters()]
    largest = max(w.numel() for w in weights)
    chunk = 1000
    assert largest > 10 * chunk
    monkeypatch.setattr(reward_actor, "MOMENT_CHUNK", chunk, raising=False)
    actor.model = SimpleNamespace(module=actor.model)  # DeepSpeed's engine around the RM
    with _Float64Sizes() as sizes:
        assert actor.rank_weight_spread() == 0.0
    assert 0 < sizes.largest <= chunk, f"a float64 tensor of {sizes.largest} elements (the largest weight: {largest})"

    whole = torch.stack([sum(w.double().sum() for w in weights), sum(w.double().square().sum() for w in weights)])
    torch.testing.assert_close(reward_actor.weight_moments(weights), whole, rtol=1e-12, atol=0)
    with _Float64Sizes() as sizes:  # the recorder sees a whole-weight copy when one is made
        weights[0].double().square()
    assert sizes.largest == weights[0].numel()


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
def test_the_assistant_engines_gpu_settings_are_decided_in_its_bundle_not_in_the_pair_actor(ray_cluster, monkeypatch):
    """The dedicated assistant's GPU decision was made inside the pair actor, which holds no GPU, so a GPU run got
    vLLM-CPU's settings (eager, no prefix caching). The CUDA boundary is faked the way a GPU node behaves: a
    process sees CUDA exactly when Ray gave it a GPU (here one of the cluster's logical GPUs), and vLLM's engine
    creation records its options. `_start_assistant_engine` runs as the pair actor would, in a process without a
    GPU (this one): the probe in the engine's bundle sees CUDA and the engine gets the GPU settings."""
    import ray
    from openrlhf.trainer.ray import vllm_engine
    from ray.util.placement_group import remove_placement_group

    from cooper_openrlhf.ray.pair_actor import PairConstructionActor
    from cooper_openrlhf.runtime import cuda_available, ray_cluster as ray_cluster_module

    def sees_cuda():  # in the probe's process: Ray's GPU ids are its CUDA_VISIBLE_DEVICES on a GPU node
        return bool(ray.get_gpu_ids())

    created = []
    monkeypatch.setattr(ray_cluster_module, "_cuda_visible", sees_cuda)
    monkeypatch.setattr(vllm_engine, "create_vllm_engines",
                        lambda *args, **options: created.append((args, options)) or ["engine"])
    pair_actor = PairConstructionActor.__ray_metadata__.modified_class.__new__(
        PairConstructionActor.__ray_metadata__.modified_class)
    assert not cuda_available() and not sees_cuda()  # like the pair actor: no GPU here
    try:
        engines = pair_actor._start_assistant_engine("assistant-model", 7, 4096, {})
        assert engines == ["engine"]
        (args, options), = created
        assert args == (1, 1, "assistant-model") and options["shared_pg"] is pair_actor._placement_group
        assert (options["enforce_eager"], options["enable_prefix_caching"]) == (False, True)  # the GPU settings
    finally:
        remove_placement_group(pair_actor._placement_group)


def test_the_reward_service_scores_with_the_rm_on_cuda(model_dir):
    """The service's scorer on a GPU: batches follow the RM to its device and logits come back as floats for the
    reward modes. (Publishing a version is `copy.deepcopy` + `load_state_dict`, which keep torch's devices; the fake
    cannot follow a deepcopy, so it is not run under it.)"""
    from cooper_openrlhf.rm.model import load_rm
    from cooper_openrlhf.core import REWARD_MODES, RolloutVerdicts, rewards
    from cooper_openrlhf.rm.scorer import RMScorer
    from cooper_openrlhf.verify.rule import Verdict

    model, tokenizer, version = load_rm(str(model_dir("tiny-qwen2-rm")))
    fake = FakeCuda()
    with fake:
        fake.put(model)
        scorer = RMScorer(model, tokenizer, max_length=128, template_version=version, batch_size=2)
        logits = scorer.logits_of([(0, "1+1?", "2", "The answer is 2."), (0, "2+2?", "4", "It is 5."),
                               (0, "3+3?", "6", "#### 6")])
    assert all(isinstance(x, float) for x in logits)
    verdicts = RolloutVerdicts.of([Verdict.CORRECT, Verdict.INCORRECT, Verdict.CORRECT])
    assert len(rewards(REWARD_MODES["rm_answer_gated"], verdicts, logits).paid) == 3
