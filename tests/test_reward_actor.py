"""TrainableRewardModelActor on a local CPU Ray cluster: scoring, the masked pairwise update across two
data-parallel ranks, checkpoint round trip, and a step with non-finite loss that must be skipped."""

import pytest
import torch

from cooper_openrlhf.runtime.dtype import torch_dtype

pytestmark = pytest.mark.slow

QUESTIONS = ["What is 2 + 3?", "What is 10 - 4?", "What is 6 * 7?", "What is 9 + 9?"]
REFERENCES = ["5", "6", "42", "18"]


def _strategy(extra: list[str] = ()):
    from openrlhf.utils import get_strategy

    from cooper_openrlhf.cli.cooper_args import add_cooper_args
    from cooper_openrlhf.runtime.openrlhf_args import openrlhf_ppo_parser, parse_openrlhf_args

    argv = ["--ds.attn_implementation", "eager", "--ds.param_dtype", "auto", "--remote_rm_trainable",
            "--cooper.rm_lr", "1e-2", "--cooper.rm_warmup_ratio", "0", "--cooper.rm_lr_scheduler", "constant",
            "--cooper.rm_micro_batch_size", "2", "--cooper.rm_score_batch_size", "2", "--cooper.rm_max_length", "128",
            "--cooper.rm_max_norm", "100",
            *extra]
    return get_strategy(parse_openrlhf_args(argv, add_cooper_args(openrlhf_ppo_parser())))


def _group(ray, num_ranks: int, path: str, ckpt_dir: str):
    from openrlhf.trainer.ray.launcher import RayActorGroup

    from cooper_openrlhf.ray.reward_actor import TrainableRewardModelActor

    strategy = _strategy(["--ckpt.path", ckpt_dir])
    group = RayActorGroup(1, num_ranks, TrainableRewardModelActor, num_gpus_per_actor=1)
    ray.get(group.async_init_model_from_pretrained(strategy, path, 10, strategy.args.cooper))
    return group


def _pairs(valid: list[bool]):
    from cooper_openrlhf.algo.pairs import PairBatch

    n = len(valid)
    positives = [f"{q.split('?')[0]} = {r}. The answer is {r}." if ok else "" for q, r, ok in zip(QUESTIONS, REFERENCES, valid)]
    negatives = [f"The answer is {int(r) + 1}." if ok else "" for r, ok in zip(REFERENCES, valid)]
    return PairBatch(QUESTIONS[:n], REFERENCES[:n], positives[:n], negatives[:n], valid, list(range(n)),
                     ["assistant" if ok else "" for ok in valid])


def _direct_loss_and_grad_norm(path: str, pairs):
    """The global masked-mean pairwise loss over the valid pairs, and its gradient norm, on the plain HF model."""
    from cooper_openrlhf.algo.losses import pairwise_rm_loss
    from cooper_openrlhf.rm.model import load_rm, render_and_encode, rm_logits

    model, tokenizer, version = load_rm(path, dtype=torch_dtype("auto"))
    model.train()
    k = len(pairs)
    batch = render_and_encode(tokenizer, pairs.questions * 2, pairs.references * 2, pairs.positives + pairs.negatives,
                              128, version)
    logits = rm_logits(model, batch)
    loss, _ = pairwise_rm_loss(logits[:k], logits[k:], pairs.valid_mask())
    loss.backward()
    grad_norm = torch.sqrt(sum(p.grad.float().pow(2).sum() for p in model.parameters() if p.grad is not None))
    return loss.item(), grad_norm.item()


def _direct_scores(path: str, completions: list[str]) -> torch.Tensor:
    from cooper_openrlhf.rm.model import load_rm, render_and_encode, rm_logits

    model, tokenizer, version = load_rm(path, dtype=torch_dtype("auto"))
    with torch.no_grad():
        return rm_logits(model.eval(), render_and_encode(tokenizer, QUESTIONS, REFERENCES, completions, 128, version))


def _kill(ray, group):
    for actor in group._actor_handlers:
        ray.kill(actor)


def test_two_ranks_score_train_on_exactly_the_valid_pairs_and_round_trip_a_checkpoint(ray_cluster, model_dir, tmp_path):
    ray = ray_cluster
    path = model_dir("tiny-qwen2-rm")
    completions = ["The answer is 5.", "4 + 2 = 6", "The answer is 41.", "18"]
    group = _group(ray, 2, path, str(tmp_path / "ckpt"))
    a, b = group._actor_handlers
    try:
        # Scoring, split over the ranks (rank 0 in forwards of 2 and 1), equals a direct forward of the same texts.
        scored = ray.get([a.score.remote(QUESTIONS[:3], REFERENCES[:3], completions[:3]),
                          b.score.remote(QUESTIONS[3:], REFERENCES[3:], completions[3:])])
        torch.testing.assert_close(torch.tensor(scored[0] + scored[1]), _direct_scores(path, completions), atol=1e-3, rtol=0)

        # Three valid pairs of four, unevenly spread: rank 0 holds slots 0-1 (one invalid), rank 1 slots 2-3.
        pairs = _pairs([True, False, True, True])
        expected_loss, expected_grad_norm = _direct_loss_and_grad_norm(path, pairs)
        rank0, rank1 = pairs.split(2)
        metrics = ray.get([a.fit.remote(rank0, 3), b.fit.remote(rank1, 3)])
        for rank_metrics in metrics:
            assert rank_metrics.pop("cooper/rm_fit_seconds") > 0
        assert metrics[0] == metrics[1]  # all-reduced
        m = metrics[0]
        assert m["cooper/rm_valid_pairs"] == 3 and m["cooper/rm_steps_skipped"] == 0
        assert m["cooper/rm_optimizer_steps"] == 1
        assert m["cooper/rm_loss"] == pytest.approx(expected_loss, abs=2e-3)
        # The gradient is that of the global masked mean: a per-rank mean or a missing world factor is >= 30% off.
        assert m["cooper/rm_grad_norm"] == pytest.approx(expected_grad_norm, rel=0.05)

        ray.get(group.async_run_method(method_name="save_checkpoint", tag="global_step1", client_states={"global_step": 1}))
        after_one = torch.tensor(ray.get(a.score.remote(QUESTIONS, REFERENCES, completions)))
        assert not torch.allclose(after_one, torch.tensor(scored[0] + scored[1]))  # the RM moved

        ray.get([a.fit.remote(rank0, 3), b.fit.remote(rank1, 3)])  # a second step moves it again...
        assert not torch.allclose(torch.tensor(ray.get(a.score.remote(QUESTIONS, REFERENCES, completions))), after_one)
        restored = ray.get(group.async_run_method(method_name="load_checkpoint", tag="global_step1"))
        assert restored[0]["global_step"] == 1
        assert restored[0]["cooper_rm_counters"] == {"optimizer_steps": 1, "skipped_steps": 0, "updates": 1}
        # ...and loading undoes it, bit for bit.
        assert torch.equal(torch.tensor(ray.get(a.score.remote(QUESTIONS, REFERENCES, completions))), after_one)

        # A step without any valid pair takes no optimizer step.
        none_valid = ray.get([a.fit.remote(_pairs([False, False]), 0), b.fit.remote(_pairs([False, False]), 0)])
        assert none_valid[0] == {"cooper/rm_updated": 0.0, "cooper/rm_valid_pairs": 0.0, "cooper/rm_optimizer_steps": 1.0}

        export = ray.get(group.async_run_method(method_name="save_model", out_dir=str(tmp_path / "rm_export")))[0]
    finally:
        _kill(ray, group)
    torch.testing.assert_close(_direct_scores(export, completions), after_one, atol=1e-3, rtol=0)


def test_a_step_with_non_finite_loss_is_skipped_and_counted(ray_cluster, model_dir, tmp_path):
    """An RM whose head weights are infinite gives non-finite logits (in any dtype), hence a non-finite loss: the step
    must not touch the weights."""
    from cooper_openrlhf.rm.model import load_rm

    model, tokenizer, _ = load_rm(model_dir("tiny-qwen2-rm"))
    with torch.no_grad():
        model.score.weight.fill_(float("inf"))
    broken = tmp_path / "overflowing_rm"
    model.save_pretrained(broken)
    tokenizer.save_pretrained(broken)

    ray = ray_cluster
    group = _group(ray, 1, str(broken), str(tmp_path / "ckpt"))
    (actor,) = group._actor_handlers
    try:
        before = ray.get(actor.save_model.remote(str(tmp_path / "before")))
        metrics = ray.get(actor.fit.remote(_pairs([True, True]), 2))
        after = ray.get(actor.save_model.remote(str(tmp_path / "after")))
    finally:
        _kill(ray, group)
    assert metrics["cooper/rm_steps_skipped"] == 1
    assert metrics["cooper/rm_optimizer_steps"] == 0
    assert "cooper/rm_grad_norm" not in metrics
    from safetensors.torch import load_file

    weights_before, weights_after = load_file(f"{before}/model.safetensors"), load_file(f"{after}/model.safetensors")
    assert weights_before.keys() == weights_after.keys()
    for name in weights_before:
        assert torch.equal(weights_before[name], weights_after[name]), name
