"""The RM group's scores of rollout texts, a mixin of `ray/trainer.CooperPPOTrainer`: the step's rewards and
held-out evaluation (`ray/evaluation.py`) both pay through it, so every RM metric is what the policy is paid."""

import ray
import torch

from cooper_openrlhf.algo.pairs import distinct, even_slices
from cooper_openrlhf.core import RolloutTexts, rm_pay
from cooper_openrlhf.ray.trainer_state import CooperTrainerState, rank_actors


class RMScoring(CooperTrainerState):
    """The RM group's logits and pay of rollout texts (module docstring)."""

    def rm_rewards(self, logits: torch.Tensor, answerless) -> torch.Tensor:
        """What the RM pays each rollout (`core.rm_pay`): training, held-out and probe rollouts alike, so every RM
        metric is what the policy is paid."""
        return rm_pay(self.pay, logits, answerless)

    def rm_logits(self, texts: RolloutTexts) -> torch.Tensor:
        """(B,) RM logits of the completions (the RM template normalises them): each distinct triple scored once,
        the distinct ones split evenly over the RM ranks."""
        triples, inverse = distinct(list(zip(texts.questions, texts.references, texts.completions)))
        actors = rank_actors(self.rm_group)
        parts = [part for part in even_slices(len(triples), len(actors)) if part.stop > part.start]
        refs = [actor.score.remote(*(list(column) for column in zip(*triples[part])))
                for actor, part in zip(actors, parts)]
        scored = [logit for chunk in ray.get(refs) for logit in chunk]
        # On the CPU on purpose: this actor holds no GPU, and the logits become the samples' rewards, which OpenRLHF
        # keeps on the CPU (tests/test_device_lint.py ALLOWED).
        logits = torch.tensor([scored[i] for i in inverse], dtype=torch.float32)
        if self.args.train.colocate_all:
            # As stock OpenRLHF after its reward forwards: the RM's cached blocks go back to the shared GPUs
            # before the policy's forward and update need them.
            ray.get(self.rm_group.async_run_method(method_name="empty_cache"))
        return logits
