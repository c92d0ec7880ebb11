"""The reward service's learner: Cooper's RM update on the groups the service has scored.

A step is `groups_per_update` complete groups (set it to the trainer's prompts per step, `--rollout.batch_size`,
and a synchronous trainer's step t is one step here: the RM moves exactly between steps, the paper's timing; the
service's log and /metrics call it a round). Per step the core's pair pipeline (`core.build_pairs`, the one the
trainer runs): positives are the rollouts the rule verifier marks correct, rollouts are proved wrong by the same
verifier pool (`core.pair_builder.PairBuilder`), negatives come from the group's own proven-wrong rollouts
(`negative_source` "rollout", the default here: no generation needed) or an assistant's rewrites through an
OpenAI-compatible endpoint ("assistant" / "mixed"); then `rm.pairwise_update.pairwise_update`, the RM actor's own
update, on a DeepSpeed engine prepared as the actor's. The trained weights are published to the scorer as the next
version (`rm/scorer.py`).

Runs in the service's learner thread, one step at a time; knows nothing of HTTP.
"""

import logging
import time
from dataclasses import dataclass

from cooper_openrlhf.algo.metric_keys import PAID_REWARD
from cooper_openrlhf.algo.pairs import PairBatch
from cooper_openrlhf.core import PairConfig, PayConfig, Rollouts, RolloutTexts, RolloutVerdicts, build_pairs
from cooper_openrlhf.core.rewards import reward_metrics, rm_pay
from cooper_openrlhf.core.rollouts import verdict_metrics
from cooper_openrlhf.rm.pairwise_update import RMTrainer, pairwise_update
from cooper_openrlhf.serve.groups import Group

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LearnConfig:
    groups_per_update: int  # complete groups per step (the trainer's prompts per step)
    negative_source: str = "rollout"  # algo.selection's sources: rollout | assistant | mixed
    rollout_negative_pick: str = "hardest"  # hardest (the wrong rollout the RM pays most) | random
    answerless_negatives: bool = False  # answerless rollouts may be rollout negatives too
    passes: int = 1  # optimizer steps over a step's pairs (--cooper.rm_updates_per_step)
    seed: int = 0

    def pairs(self, group_size: int) -> PairConfig:
        return PairConfig(group_size, self.negative_source, self.rollout_negative_pick, self.answerless_negatives,
                          self.seed)


def rollouts_of(groups: list[Group]) -> tuple[Rollouts, list]:
    """A step's complete groups as the core reads them (flat, prompt-grouped: P groups x n), and the samples'
    (B,) verdicts (`verify.rule.Verdict`). Proven-wrong flags are the prepared groups' (all False where none is)."""
    scored = [s for group in groups for s in group.scored]
    verdicts = [s.outcome.verdict for s in scored]
    proven = [wrong for group in groups for wrong in (group.proven_wrong or [False] * len(group.scored))]
    texts = RolloutTexts([s.sample.question for s in scored], [s.sample.reference for s in scored],
                         [s.sample.completion for s in scored])
    return Rollouts(texts, RolloutVerdicts.of(verdicts, proven), [s.logit for s in scored]), verdicts


def step_metrics(groups: list[Group], pay: PayConfig) -> dict[str, float]:
    """What the hacking monitor reads of a step: the RM's pay (in `pay`'s form, whoever pays) next to the rule
    verifier's verdicts, under the trainer's keys, and what the trainer was paid."""
    rollouts, verdicts = rollouts_of(groups)
    paid = [s.reward for group in groups for s in group.scored]
    by_rm = rm_pay(pay, rollouts.rm_logits, rollouts.verdicts.answerless)
    return {**verdict_metrics(verdicts), **reward_metrics(rollouts.verdicts, by_rm),
            PAID_REWARD: sum(paid) / len(paid), "cooper/samples": float(len(paid))}


class Learner:
    """Builds a step's pairs and trains the RM on them; see the module docstring.

    pair_builder: a `core.pair_builder.PairBuilder` over the service's verifier pool (and assistant engine): the
    core's verifier and assistant side, as the trainer's pair actor holds one.
    """

    def __init__(self, trainer: RMTrainer, pair_builder, config: LearnConfig):
        self.trainer, self.pair_builder, self.config = trainer, pair_builder, config

    def prepare(self, group: Group) -> None:
        """Prove which of a complete group's samples are wrong (the verifier's both-ways check, the slow part of
        building pairs), as soon as the group completes: a step's update then waits only for its last group."""
        group.proven_wrong = self.pair_builder.proven_wrong([s.sample.reference for s in group.scored],
                                                            [s.outcome for s in group.scored])

    def pairs_of(self, groups: list[Group], group_size: int, step: int) -> tuple[PairBatch, dict[str, float]]:
        """The step's PairBatch (one slot per group) and its `cooper/*` pair metrics (`core.build_pairs`)."""
        for group in groups:
            if group.proven_wrong is None:
                self.prepare(group)
        rollouts, _ = rollouts_of(groups)
        return build_pairs(self.config.pairs(group_size), rollouts.texts, rollouts.verdicts, rollouts.rm_logits,
                           self.pair_builder.assistant_negatives, step)

    def discard_gradients(self) -> None:
        """Drop whatever gradients a failed update left accumulated, so the next step's update holds only its own.

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

    def learn(self, groups: list[Group], group_size: int, step: int) -> tuple[bool, dict[str, float]]:
        """(whether the RM changed, metrics): the step's pairs and one Cooper RM update on them."""
        start = time.perf_counter()
        pairs, metrics = self.pairs_of(groups, group_size, step)
        metrics["timing/serve_pairs"] = time.perf_counter() - start
        metrics.update(pairwise_update(self.trainer, pairs, pairs.num_valid, passes=self.config.passes))
        updated = bool(metrics["cooper/rm_updated"]) and metrics.get("cooper/rm_steps_skipped", 0) < self.config.passes
        if not pairs.num_valid:
            logger.info("step %d: no valid pair in %d groups; the RM is unchanged", step, len(groups))
        return updated, metrics
