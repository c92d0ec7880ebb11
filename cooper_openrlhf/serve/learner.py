"""The reward service's learner: Cooper's RM update on the groups the service has scored.

A *round* is `groups_per_update` complete groups (set it to the trainer's prompts per step, `--rollout.batch_size`,
and a synchronous trainer's step t is one round: the RM moves exactly between steps, the paper's timing). Per
round, the same pipeline as the trainer's (`algo.selection` through `ray.pair_builder.PairBuilder.build_pairs`):
positives are the rollouts the rule verifier marks correct, rollouts are proved wrong by the same verifier pool,
negatives come from the group's own proven-wrong rollouts (`negative_source` "rollout", the default here: no
generation needed) or an assistant's rewrites through an OpenAI-compatible endpoint ("assistant" / "mixed"); then
`rm.pairwise_update.pairwise_update`, the RM actor's own update, on a DeepSpeed engine prepared as the actor's.
The trained weights are published to the scorer as the next version (`serve/scorer.py`).

Runs in the service's learner thread, one round at a time; knows nothing of HTTP.
"""

import logging
import time
from dataclasses import dataclass

from cooper_openrlhf.algo.hacking_stats import rm_reward_by_verdict
from cooper_openrlhf.algo.metric_keys import ACCURACY, GAP, RM_REWARD
from cooper_openrlhf.algo.pairs import PairBatch
from cooper_openrlhf.rm.pairwise_update import RMTrainer, pairwise_update
from cooper_openrlhf.serve.groups import Group
from cooper_openrlhf.verify.rule import Verdict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LearnConfig:
    groups_per_update: int  # complete groups per round (the trainer's prompts per step)
    negative_source: str = "rollout"  # algo.selection's sources: rollout | assistant | mixed
    rollout_negative_pick: str = "hardest"  # hardest (the wrong rollout the RM pays most) | random
    answerless_negatives: bool = False  # answerless rollouts may be rollout negatives too
    passes: int = 1  # optimizer steps over a round's pairs (--cooper.rm_updates_per_step)
    seed: int = 0


@dataclass
class RoundTexts:
    """A round's samples, flat and prompt-grouped (P groups x n), as the pair pipeline takes them."""

    questions: list[str]
    references: list[str]
    completions: list[str]
    logits: list[float]
    outcomes: list  # VerifyOutcome per sample
    rewards: list[float]  # what the trainer was paid

    @classmethod
    def of(cls, groups: list[Group]) -> "RoundTexts":
        scored = [s for group in groups for s in group.scored]
        return cls([s.sample.question for s in scored], [s.sample.reference for s in scored],
                   [s.sample.completion for s in scored], [s.logit for s in scored], [s.outcome for s in scored],
                   [s.reward for s in scored])


def round_metrics(texts: RoundTexts, rm_rewards: list[float]) -> dict[str, float]:
    """What the hacking monitor reads of a round: the RM's pay next to the rule verifier's verdicts (the trainer's keys).

    rm_rewards: (B,) what the RM pays each sample (its reward form), whatever the service's mode paid.
    """
    correct = [o.verdict == Verdict.CORRECT for o in texts.outcomes]
    accuracy = sum(correct) / len(correct)
    rm_mean = sum(rm_rewards) / len(rm_rewards)
    metrics = {ACCURACY: accuracy, RM_REWARD: rm_mean, GAP: rm_mean - accuracy,
               "cooper/reward_paid_mean": sum(texts.rewards) / len(texts.rewards),
               "cooper/verify_no_answer": float(sum(o.verdict == Verdict.NO_ANSWER for o in texts.outcomes)),
               "cooper/verify_timeouts": float(sum(o.verdict == Verdict.TIMEOUT for o in texts.outcomes)),
               "cooper/samples": float(len(correct))}
    metrics.update({f"cooper/{k}": v for k, v in rm_reward_by_verdict(correct, rm_rewards).items()})
    return metrics


class Learner:
    """Builds a round's pairs and trains the RM on them; see the module docstring.

    pair_builder: a `ray.pair_builder.PairBuilder` over the service's verifier pool (and assistant engine).
    """

    def __init__(self, trainer: RMTrainer, pair_builder, config: LearnConfig):
        self.trainer, self.pair_builder, self.config = trainer, pair_builder, config

    def prepare(self, group: Group) -> None:
        """Prove which of a complete group's samples are wrong (the verifier's both-ways check, the slow part of
        building pairs), as soon as the group completes: a round's update then waits only for its last group."""
        group.proven_wrong = self.pair_builder.proven_wrong([s.sample.reference for s in group.scored],
                                                            [s.outcome for s in group.scored])

    def pairs_of(self, groups: list[Group], texts: RoundTexts, group_size: int,
                 round_index: int) -> tuple[PairBatch, dict[str, float]]:
        """The round's PairBatch (one slot per group) and its `cooper/*` pair metrics."""
        for group in groups:
            if group.proven_wrong is None:
                self.prepare(group)
        correct = [o.verdict == Verdict.CORRECT for o in texts.outcomes]
        proven_wrong = [wrong for group in groups for wrong in group.proven_wrong]
        answerless = [o.verdict == Verdict.NO_ANSWER for o in texts.outcomes]
        return self.pair_builder.build_pairs(
            texts.questions, texts.references, texts.completions, correct, group_size, step=round_index,
            proven_wrong=proven_wrong, answerless=answerless, answerless_negatives=self.config.answerless_negatives,
            rm_scores=texts.logits, source=self.config.negative_source, pick=self.config.rollout_negative_pick)

    def discard_gradients(self) -> None:
        """Drop whatever gradients a failed update left accumulated, so the next round's step holds only its own.

        What DeepSpeed's ZeRO 1/2 optimizer itself does when it skips a step on overflow (`stage_1_and_2.step`)."""
        engine = self.trainer.model
        engine.zero_grad()
        optimizer = getattr(engine, "optimizer", None)
        if optimizer is None:
            return
        optimizer.zero_grad(set_to_none=True)
        if hasattr(optimizer, "_release_preflattened_grad_buffers"):
            optimizer._release_preflattened_grad_buffers()
        if getattr(optimizer, "cpu_offload", False):
            optimizer.reset_cpu_buffers()
        for buffers in ("averaged_gradients", "all_grad_tensors"):
            held = getattr(optimizer, buffers, None)
            if isinstance(held, dict):
                for key in held:
                    held[key] = None

    def learn(self, groups: list[Group], group_size: int, round_index: int) -> tuple[bool, dict[str, float]]:
        """(whether the RM changed, metrics): the round's pairs and one Cooper RM update on them."""
        start = time.perf_counter()
        texts = RoundTexts.of(groups)
        pairs, metrics = self.pairs_of(groups, texts, group_size, round_index)
        metrics["timing/serve_pairs"] = time.perf_counter() - start
        metrics.update(pairwise_update(self.trainer, pairs, pairs.num_valid, passes=self.config.passes))
        updated = bool(metrics["cooper/rm_updated"]) and metrics.get("cooper/rm_steps_skipped", 0) < self.config.passes
        if not pairs.num_valid:
            logger.info("round %d: no valid pair in %d groups; the RM is unchanged", round_index, len(groups))
        return updated, metrics
