"""A step's pairs: `algo.selection`'s pipeline, run once for both transports.

  plan = plan_pairs(config, verdicts)                       positives, rollout-negative candidates, the assistant's
                                                            prompts (`algo.selection.plan_negatives`)
  request = rewrite_request(config, plan, texts)            what the assistant is asked to rewrite
  ... an engine writes the rewrites (`core.pair_builder.PairBuilder.assistant_negatives`, on whatever transport) ...
  pairs, metrics = finish_pairs(config, plan, texts, rewrites, rm_logits, step)

The trainer starts the rewrites between `plan_pairs` and `finish_pairs` so that they overlap its RM scoring; the
reward service, whose verdicts and logits are all in when a step's groups are complete, runs `build_pairs`, the same
three calls in a row. Inputs are flat and prompt-grouped (P prompts x n rollouts); a step without positives or
negatives never raises: those slots are invalid.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cooper_openrlhf.algo import selection
from cooper_openrlhf.algo.pairs import PairBatch
from cooper_openrlhf.core.rollouts import RolloutTexts, RolloutVerdicts


@dataclass(frozen=True)
class PairConfig:
    """How a step's pairs are made (`algo.selection` says what each choice does)."""

    n_samples_per_prompt: int  # rollouts per prompt (the GRPO group size)
    negative_source: str = "assistant"  # assistant | rollout | mixed
    rollout_negative_pick: str = "hardest"  # hardest (the wrong rollout the RM pays most) | random
    answerless_negatives: bool = False  # answerless rollouts may be rollout negatives too
    seed: int = 0  # step t's random pick is seeded with seed + t


@dataclass(frozen=True)
class RewriteRequest:
    """What the assistant is asked for: rewrite positives[p] of each p in `prompts`."""

    questions: list[str]  # (P,) each prompt's raw question
    positives: list[str]  # (P,) each prompt's positive as raw rollout text, "" where none
    prompts: list[int]  # the prompts whose positive the assistant rewrites


def plan_pairs(config: PairConfig, verdicts: RolloutVerdicts) -> selection.NegativePlan:
    """The step's pair plan, before any rewrite."""
    return selection.plan_negatives(verdicts.correct, verdicts.proven_wrong, verdicts.answerless,
                                    config.n_samples_per_prompt, config.negative_source, config.answerless_negatives)


def rewrite_request(config: PairConfig, plan: selection.NegativePlan, texts: RolloutTexts) -> RewriteRequest:
    """What the assistant must rewrite for the plan (no prompt when the source is "rollout")."""
    questions = group_firsts(texts.questions, config.n_samples_per_prompt, "question")
    return RewriteRequest(questions, plan.positive_texts(texts.completions), list(plan.ask_assistant))


def finish_pairs(config: PairConfig, plan: selection.NegativePlan, texts: RolloutTexts, rewrites: dict[int, str],
                 rm_logits: Sequence[float] | None, step: int) -> tuple[PairBatch, dict[str, float]]:
    """The step's PairBatch (one slot per prompt) and its `cooper/*` pair metrics, once the rewrites are in.

    rewrites: prompt -> the assistant's valid rewrite. rm_logits: (P * n,) the RM's scores of the rollouts (pick
    "hardest" with rollout or mixed negatives)."""
    n = config.n_samples_per_prompt
    return selection.finish_pairs(plan, group_firsts(texts.questions, n, "question"),
                                  group_firsts(texts.references, n, "reference"), texts.completions, rewrites,
                                  None if rm_logits is None else list(rm_logits), config.rollout_negative_pick,
                                  seed=config.seed + step)


Rewriter = Callable[..., tuple[dict[int, str], dict[str, float]]]  # PairBuilder.assistant_negatives' signature


def build_pairs(config: PairConfig, texts: RolloutTexts, verdicts: RolloutVerdicts, rm_logits: Sequence[float] | None,
                rewrite: Rewriter, step: int) -> tuple[PairBatch, dict[str, float]]:
    """One step's pairs, serially: plan, the rewrites (`rewrite(questions, positives, prompts, step=step)`), finish.
    Returns the PairBatch and its metrics (the rewrites' and the pairs')."""
    flat = (texts.questions, texts.references, texts.completions, verdicts.correct)
    if len({len(items) for items in flat}) != 1:
        raise ValueError("questions, references, completions and verdicts must have one entry per rollout; "
                         f"got lengths {[len(items) for items in flat]}")
    plan = plan_pairs(config, verdicts)  # validates the grouping
    request = rewrite_request(config, plan, texts)
    rewrites, metrics = rewrite(request.questions, request.positives, request.prompts, step=step)
    pairs, pair_metrics = finish_pairs(config, plan, texts, rewrites, rm_logits, step)
    return pairs, {**metrics, **pair_metrics}


def group_firsts(items: Sequence[str], n: int, name: str) -> list[str]:
    """Each group's first item; raises if a group's items differ (the batch is not prompt-grouped)."""
    firsts = []
    for p in range(0, len(items), n):
        group = items[p : p + n]
        if any(item != group[0] for item in group):
            raise ValueError(
                f"prompt {p // n}: its {n} rollouts carry different {name}s; inputs must be prompt-grouped "
                f"(rollouts {p}..{p + n - 1} of one prompt)"
            )
        firsts.append(group[0])
    return firsts
