"""Cooper's pair selection: per prompt, which rollout is the positive and where its negative comes from.

Pure functions over one step's flat, prompt-grouped rollout lists (P prompts x n rollouts, the n
rollouts of a prompt contiguous). Nothing here knows Ray, the verifier or an engine: the pair
actor supplies the verdicts and the assistant's rewrites, the trainer the RM scores.

Per prompt (arXiv 2508.05613, sec. 3.2):
- positive: the first verified-correct rollout in batch order (`select_positives`);
- negative, by `--cooper.negative_source`, a strategy looked up in `NEGATIVE_SOURCES` (one module each in
  `algo/negative_sources/`; nothing here compares its name):
    assistant  an assistant's rewrite of the positive (the paper's); `--cooper.negative_validity` says which count:
               strict, a final answer proved different; official (the recipe's), not proved equal (`negative_is_valid`)
    rollout    one of the prompt's own rollouts whose answer is proved different from the reference
               (`select_rollout_negatives`); "hardest" = the one the RM scores highest, "random" = seeded;
               with --cooper.answerless_negatives a rollout with no final answer is a candidate too
               (`rollout_negative_candidates`)
    mixed      a rollout negative where one exists, an assistant rewrite for the prompts without one
  (`assistant_prompts` says which prompts need the assistant; `assemble_pairs` builds the PairBatch).
A prompt without a positive, or whose chosen source gave nothing, keeps its slot with valid=False.

The pipeline, run by the Cooper core (`core/step_pairs.py`) for both the trainer and the reward service:
  plan = plan_negatives(...)          positives, rollout-negative candidates, the prompts to ask the assistant
  ... the assistant rewrites plan.positive_texts(completions) for plan.ask_assistant (an engine's work) ...
  pairs, metrics = finish_pairs(plan, ..., rewrites, rm_scores, pick, seed)

The RM reads every completion normalised (`algo.negatives.normalize_solution`, applied by the RM template), so it
cannot learn a formatting shortcut (e.g. "text after the final box means correct"). The pairs hold their texts
normalised as well, the same function that cleans the assistant's replies: a negative identical to its positive
once normalised is no pair, and the logged pairs are what the RM read.
"""

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

from cooper_openrlhf.algo.negative_sources import FROM_ASSISTANT, FROM_NONE, FROM_ROLLOUT
from cooper_openrlhf.algo.negatives import normalize_solution
from cooper_openrlhf.algo.pairs import NO_POSITIVE, PairBatch, group_rollouts
from cooper_openrlhf.algo.registry import NEGATIVE_SOURCES, NEGATIVE_VALIDITIES, ROLLOUT_NEGATIVE_PICKS

logger = logging.getLogger(__name__)

NO_ROLLOUT = -1


def negative_is_valid(validity: str, has_answer: bool, equivalent: bool | None) -> bool:
    """Whether an assistant's rewrite of a positive is a negative, by `--cooper.negative_validity`.

    has_answer: a final answer could be extracted from the rewrite. equivalent: the verifier's proof that the
    rewrite's answer equals the positive's (True), differs from it (False), or undecided (None); ignored without
    an answer.
    strict    the rewrite's answer is proved different from the positive's (an answerless or undecided rewrite is
              rejected: a negative that might be correct would mislabel the pair). This package's default.
    official  the official Cooper recipe's rule (github.com/ZJU-REAL/Cooper, recipe/cooper): any rewrite that
              math-verify does not prove equal to the positive, so an answerless or undecided rewrite counts.
    (A rewrite identical to the positive is never a negative, under either rule: `assemble_pairs`.)
    """
    NEGATIVE_VALIDITIES.check(validity)
    if validity == "strict":
        return has_answer and equivalent is False
    return not (has_answer and equivalent is True)


def select_positives(verified_correct: Sequence[bool], n_samples_per_prompt: int) -> list[int]:
    """For each prompt, the flat index of its first verified-correct rollout, or NO_POSITIVE (-1).

    verified_correct: (P * n,) prompt-grouped, True where the rule verifier says CORRECT.
    Returns (P,) flat indices into the rollout list.
    """
    positives = []
    for prompt, group in enumerate(group_rollouts(list(verified_correct), n_samples_per_prompt)):
        first = next((j for j, correct in enumerate(group) if correct), None)
        positives.append(NO_POSITIVE if first is None else prompt * n_samples_per_prompt + first)
    return positives


def select_rollout_negatives(
    proven_wrong: Sequence[bool],
    n_samples_per_prompt: int,
    rm_scores: Sequence[float] | None = None,
    pick: str = "hardest",
    seed: int = 0,
) -> list[int]:
    """For each prompt, the flat index of one of its rollouts proved wrong, or NO_ROLLOUT (-1).

    proven_wrong: (P * n,) True only where the rollout's extracted answer was proved different from
        the reference (an unextractable answer, a timeout or an error is never proved wrong).
    rm_scores: (P * n,) the RM's scores of the rollouts (needed by "hardest").
    pick: "hardest" = the highest RM score among the prompt's wrong rollouts (ties: the first in batch
        order), i.e. the wrong answer the RM is most fooled by; "random" = a seeded uniform choice.
    """
    ROLLOUT_NEGATIVE_PICKS.check(pick)
    if pick == "hardest" and (rm_scores is None or len(rm_scores) != len(proven_wrong)):
        raise ValueError(f"'hardest' needs one RM score per rollout; got {None if rm_scores is None else len(rm_scores)}"
                         f" scores for {len(proven_wrong)} rollouts")
    rng = random.Random(seed)
    negatives = []
    for prompt, group in enumerate(group_rollouts(list(proven_wrong), n_samples_per_prompt)):
        candidates = [prompt * n_samples_per_prompt + j for j, wrong in enumerate(group) if wrong]
        if not candidates:
            negatives.append(NO_ROLLOUT)
        elif pick == "hardest":
            negatives.append(max(candidates, key=lambda i: (rm_scores[i], -i)))
        else:
            negatives.append(rng.choice(candidates))
    return negatives


def rollout_negative_candidates(proven_wrong: Sequence[bool], answerless: Sequence[bool],
                                include_answerless: bool) -> list[bool]:
    """(P * n,) which rollouts may be a rollout negative: those proved wrong, and with `include_answerless`
    also those with no final answer at all (Verdict.NO_ANSWER; never a timeout or an error).

    Why answerless ones may count: such a rollout can never be graded correct, so ranking it below a verified-
    correct rollout of the same prompt is a true preference. Without them the RM never sees an answerless
    completion as a negative, and a policy that drifts to answerless text escapes co-training.
    """
    if len(proven_wrong) != len(answerless):
        raise ValueError(f"proven_wrong and answerless differ in length: {len(proven_wrong)} vs {len(answerless)}")
    return [bool(wrong or (include_answerless and none)) for wrong, none in zip(proven_wrong, answerless)]


def has_proven_wrong_rollout(proven_wrong: Sequence[bool], n_samples_per_prompt: int) -> list[bool]:
    """(P,) True where the prompt has at least one rollout proved wrong (known before any RM score)."""
    return [any(group) for group in group_rollouts(list(proven_wrong), n_samples_per_prompt)]


def assistant_prompts(positive_index: Sequence[int], has_rollout_negative: Sequence[bool], source: str) -> list[int]:
    """The prompts whose negative the assistant must write: of those with a positive, the ones the source asks it
    for (`assistant`: all; `mixed`: those with no wrong rollout; `rollout`: none)."""
    strategy = NEGATIVE_SOURCES[source]
    return [p for p, i in enumerate(positive_index)
            if i != NO_POSITIVE and strategy.needs_rewrite(has_rollout_negative[p])]


def assemble_pairs(
    questions: Sequence[str],
    references: Sequence[str],
    completions: Sequence[str],
    positive_index: Sequence[int],
    rollout_negative: Sequence[int],
    assistant_negatives: dict[int, str],
    source: str,
) -> PairBatch:
    """The step's PairBatch: one slot per prompt, in prompt order.

    questions, references: (P,) per prompt. completions: (P * n,) raw rollout texts.
    positive_index, rollout_negative: (P,) flat indices (NO_POSITIVE / NO_ROLLOUT where none).
    assistant_negatives: prompt -> the assistant's valid rewrite (already normalised); prompts
        without a valid rewrite are absent or map to "".
    """
    strategy = NEGATIVE_SOURCES[source]
    sizes = {len(questions), len(references), len(positive_index), len(rollout_negative)}
    if len(sizes) != 1:
        raise ValueError(f"per-prompt inputs have different lengths: {sorted(sizes)}")
    positives, negatives, kinds = [], [], []
    for p, i in enumerate(positive_index):
        # Normalised here, not only by the RM template: the identity check below compares what the RM reads.
        positive = normalize_solution(completions[i]) if i != NO_POSITIVE else ""
        negative, kind = "", FROM_NONE
        if positive:
            rollout = None
            if strategy.reads_rollouts and rollout_negative[p] != NO_ROLLOUT:
                rollout = normalize_solution(completions[rollout_negative[p]])
            negative, kind = strategy.choose(rollout, assistant_negatives.get(p) or "")
        if not negative or negative == positive:  # an empty or unchanged negative is never a pair
            negative, kind = "", FROM_NONE
        positives.append(positive)
        negatives.append(negative)
        kinds.append(kind)
    valid = [bool(pos and neg) for pos, neg in zip(positives, negatives)]
    return PairBatch(list(questions), list(references), positives, negatives, valid, list(positive_index), kinds)


def pair_metrics(batch: PairBatch, has_rollout_negative: Sequence[bool]) -> dict[str, float]:
    """What the step's pairs are made of (`cooper/*` keys); rates are 0 where their denominator is 0.

    prompts_with_positive (count), valid_pair_rate (valid / P), negative_success_rate (valid / prompts
    with a positive), pairs_from_assistant / pairs_from_rollout (share of valid pairs by source),
    prompts_without_wrong_rollout (count of prompts with a positive but no rollout proved wrong).
    """
    prompts = len(batch)
    with_positive = sum(i != NO_POSITIVE for i in batch.positive_index)
    valid = batch.num_valid
    by_source = {kind: sum(ok and k == kind for ok, k in zip(batch.valid, batch.negative_source))
                 for kind in (FROM_ASSISTANT, FROM_ROLLOUT)}
    return {
        "cooper/prompts_with_positive": float(with_positive),
        "cooper/valid_pair_rate": valid / prompts if prompts else 0.0,
        "cooper/negative_success_rate": valid / with_positive if with_positive else 0.0,
        "cooper/pairs_from_assistant": by_source[FROM_ASSISTANT] / valid if valid else 0.0,
        "cooper/pairs_from_rollout": by_source[FROM_ROLLOUT] / valid if valid else 0.0,
        "cooper/prompts_without_wrong_rollout": float(sum(
            i != NO_POSITIVE and not wrong for i, wrong in zip(batch.positive_index, has_rollout_negative))),
    }


# ------------------------------------------------------------------------------------ the pipeline
@dataclass
class NegativePlan:
    """What a step's rollouts offer before any rewrite: `plan_negatives`' output, `finish_pairs`' input."""

    n_samples_per_prompt: int
    source: str  # --cooper.negative_source
    positive_index: list[int]  # (P,) flat index of each prompt's positive, NO_POSITIVE where none
    candidates: list[bool]  # (P * n,) rollouts that may be a rollout negative (`rollout_negative_candidates`)
    has_wrong: list[bool]  # (P,) the prompt has a rollout-negative candidate
    ask_assistant: list[int]  # prompts whose positive the assistant must rewrite (`assistant_prompts`)
    answerless: list[bool]  # (P * n,) rollouts without a final answer (for the answerless-negative metric)

    def positive_texts(self, completions: Sequence[str]) -> list[str]:
        """(P,) each prompt's positive completion, "" where it has none (what the assistant rewrites)."""
        return [completions[i] if i != NO_POSITIVE else "" for i in self.positive_index]


def plan_negatives(verified_correct: Sequence[bool], proven_wrong: Sequence[bool], answerless: Sequence[bool] | None,
                   n_samples_per_prompt: int, source: str, answerless_negatives: bool = False) -> NegativePlan:
    """Positives, rollout-negative candidates and the assistant's prompts of one step (flat, prompt-grouped inputs).

    answerless: (P * n,) Verdict.NO_ANSWER rollouts (None: none); with `answerless_negatives` they are candidates.
    """
    NEGATIVE_SOURCES.check(source)
    answerless = [False] * len(proven_wrong) if answerless is None else list(answerless)
    positive_index = select_positives(verified_correct, n_samples_per_prompt)
    candidates = rollout_negative_candidates(proven_wrong, answerless, answerless_negatives)
    has_wrong = has_proven_wrong_rollout(candidates, n_samples_per_prompt)
    return NegativePlan(n_samples_per_prompt, source, positive_index, candidates, has_wrong,
                        assistant_prompts(positive_index, has_wrong, source), answerless)


def finish_pairs(plan: NegativePlan, questions: Sequence[str], references: Sequence[str], completions: Sequence[str],
                 rewrites: dict[int, str], rm_scores: Sequence[float] | None, pick: str,
                 seed: int) -> tuple[PairBatch, dict[str, float]]:
    """The step's PairBatch and its `cooper/*` pair metrics, once the assistant's rewrites are in.

    questions, references: (P,). completions: (P * n,) raw rollout texts. rewrites: prompt -> valid rewrite.
    rm_scores: (P * n,) the RM's scores (pick "hardest" with rollout or mixed negatives). seed: the step's
    seed of pick "random". Logs a warning when prompts have positives but no pair is valid.
    """
    rollout_negative = [NO_ROLLOUT] * len(plan.positive_index)
    if NEGATIVE_SOURCES[plan.source].reads_rollouts:
        rollout_negative = select_rollout_negatives(plan.candidates, plan.n_samples_per_prompt, rm_scores, pick,
                                                    seed=seed)
    pairs = assemble_pairs(questions, references, completions, plan.positive_index, rollout_negative, rewrites,
                           plan.source)
    metrics = pair_metrics(pairs, plan.has_wrong)
    answerless_pairs = sum(ok and kind == FROM_ROLLOUT and plan.answerless[i]
                           for ok, kind, i in zip(pairs.valid, pairs.negative_source, rollout_negative))
    metrics["cooper/pairs_answerless_negative"] = answerless_pairs / pairs.num_valid if pairs.num_valid else 0.0
    warn_if_no_pairs(pairs, metrics)
    return pairs, metrics


def warn_if_no_pairs(batch: PairBatch, metrics: dict[str, float]) -> None:
    """Log why a step with positives has no valid pair (its RM update is then skipped)."""
    with_positive = metrics["cooper/prompts_with_positive"]
    if with_positive and not batch.num_valid:
        logger.warning(
            "no valid negative for any of %d prompts with a positive (%d rewrites: %d without an answer, %d with "
            "the same answer, %d undecided; %d prompts without a wrong rollout); the RM update is masked out",
            with_positive, metrics.get("cooper/negative_attempts", 0), metrics.get("cooper/negative_rejected_no_answer", 0),
            metrics.get("cooper/negative_rejected_same_answer", 0), metrics.get("cooper/negative_rejected_undecided", 0),
            metrics["cooper/prompts_without_wrong_rollout"],
        )
