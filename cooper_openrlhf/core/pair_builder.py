"""PairBuilder: verify a step's rollouts and write the assistant's negatives, for Cooper's pairs.

The core's side that needs the verifier pool and an engine: `ray/pair_actor.py` wraps it in a Ray actor, the
reward service calls it in its learner thread, and the tests drive it with a fake engine and the real verifier
pool in milliseconds. Which rollout is a positive, which is a
rollout negative and how a pair is assembled are pure functions of `algo.selection`; this class owns
the two things that need the verifier or an engine:

1. `verify`: the rule verifier judges every rollout against its reference. Only `Verdict.CORRECT`
   counts as verified correct (timeouts, errors and missing answers do not). A rollout is *proved
   wrong* (a candidate rollout negative) only when its extracted answer is proved different from the
   reference in both directions (`equivalence_batch` is False), the same proof a rewrite needs.
2. `assistant_negatives`: the assistant rewrites the (normalised) positives of the prompts it is asked
   for (`algo.negatives`); attempt k sends the prompts still without a valid negative in ONE
   `engine.generate` call, up to `NegativeConfig.retries` attempts. A rewrite is a valid negative by
   `NegativeConfig.validity` (`algo.selection.negative_is_valid`): strict (the default), only when an
   answer can be extracted from it AND the verifier proves it different from the positive's answer
   (equivalent or undecided are rejected: a negative that might be correct would train the RM on a
   mislabelled pair); official (the Cooper recipe's), unless its answer is proved equal to the positive's.
   Never the positive unchanged, nor empty.

The pair pipeline around them is the core's (`core/step_pairs.py`): the trainer runs it with these two calls on the
pair-construction actor (`ray/pair_actor.py`), the reward service's learner in its own thread.

Seeds: attempt k of step t samples with seed `config.seed + (t * retries + k) * SEED_STRIDE`
(the engine adds each request's index), so the same step of a run reproduces its negatives.
`t` is the `step` the caller passes (the trainer's global step, which also makes a resumed run
reproduce), else the number of earlier calls.
"""

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from cooper_openrlhf.algo import selection
from cooper_openrlhf.algo.negatives import NegativeConfig, build_rewrite_messages, normalize_solution
from cooper_openrlhf.core.rollouts import RolloutVerdicts, verdict_metrics
from cooper_openrlhf.engines.base import GenerationEngine, SamplingConfig
from cooper_openrlhf.verify.extract import FALLBACKS, extract_answer
from cooper_openrlhf.verify.rule import Verdict

logger = logging.getLogger(__name__)

SEED_STRIDE = 1 << 20  # request seeds of one attempt are seed + [0, SEED_STRIDE)


class Verifier(Protocol):
    """What PairBuilder needs of `verify.pool.VerifierPool`."""

    def verify_batch(self, references: list[str], completions: list[str]): ...  # -> BatchResult

    def equivalence_batch(self, answers_a: list[str], answers_b: list[str]) -> list[bool | None]: ...

    def close(self) -> None: ...


class PairBuilder:
    """Verifies rollouts and writes the assistant's negatives; owns `verifier` (closed by `close`).

    verifier: a `VerifierPool` (or anything with its `verify_batch` / `equivalence_batch`).
    assistant: the engine that rewrites positives into negatives.
    answer_fallback: how answers are found in rollouts (`verify.extract`); the verifier's own
        `RuleVerifierConfig.answer_fallback` must be the same. Rewrites use `config.answer_fallback`.
    """

    def __init__(
        self,
        verifier: Verifier,
        assistant: GenerationEngine,
        config: NegativeConfig,
        answer_fallback: str = "none",
    ):
        if not isinstance(config, NegativeConfig):
            raise TypeError(f"config must be a NegativeConfig, got {type(config).__name__}")
        for name, value in (("answer_fallback", answer_fallback), ("config.answer_fallback", config.answer_fallback)):
            try:
                FALLBACKS.check(value)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        self.verifier = verifier
        self.assistant = assistant
        self.config = config
        self.answer_fallback = answer_fallback
        self.calls = 0  # assistant_negatives calls so far: the default seed step

    # ------------------------------------------------------------------ verify
    def verify(self, references: list[str], completions: list[str]) -> tuple[RolloutVerdicts, dict[str, float]]:
        """Verdicts per rollout and metrics.

        Metrics: "cooper/verified_accuracy" (fraction correct, 0 for an empty batch),
        "cooper/verify_timeouts", "cooper/verify_no_answer", "cooper/verify_errors",
        "cooper/verify_proven_wrong" (counts), "cooper/verify_fallback_only_correct" (rollouts that only
        the lax last-number rule accepts: with answer_fallback "none" they are NOT counted correct),
        "timing/cooper_verify" (seconds).
        """
        start = time.perf_counter()
        references, completions = list(references), list(completions)
        result = self.verifier.verify_batch(references, completions)
        outcomes = result.outcomes
        if len(outcomes) != len(completions):
            raise RuntimeError(f"verifier returned {len(outcomes)} verdicts for {len(completions)} completions")
        verdicts = [outcome.verdict for outcome in outcomes]
        proven_wrong = self.proven_wrong(references, outcomes)
        metrics = {
            **verdict_metrics(verdicts),
            "cooper/verify_proven_wrong": float(sum(proven_wrong)),
            "cooper/verify_fallback_only_correct": float(self._fallback_only_correct(references, completions, verdicts)),
            "timing/cooper_verify": time.perf_counter() - start,
        }
        return RolloutVerdicts.of(verdicts, proven_wrong), metrics

    def proven_wrong(self, references: list[str], outcomes) -> list[bool]:
        """True where an INCORRECT rollout's extracted answer is proved different in both directions."""
        wrong = [i for i, outcome in enumerate(outcomes) if outcome.verdict == Verdict.INCORRECT and outcome.extracted]
        proven = [False] * len(outcomes)
        if wrong:
            same = self.verifier.equivalence_batch([references[i] for i in wrong], [outcomes[i].extracted for i in wrong])
            for i, equivalent in zip(wrong, same):
                proven[i] = equivalent is False
        return proven

    def _fallback_only_correct(self, references: list[str], completions: list[str], verdicts: list[Verdict]) -> int:
        """Rollouts without an explicit final answer whose last number equals the reference."""
        if self.answer_fallback == "last_number":  # they were verified (and counted correct) with the fallback
            return sum(v == Verdict.CORRECT and extract_answer(c, fallback="none") is None
                       for c, v in zip(completions, verdicts))
        lax = [(i, extract_answer(completions[i], fallback="last_number")) for i, v in enumerate(verdicts)
               if v == Verdict.NO_ANSWER]
        lax = [(i, answer) for i, answer in lax if answer is not None]
        if not lax:
            return 0
        result = self.verifier.verify_batch([references[i] for i, _ in lax], [f"\\boxed{{{a}}}" for _, a in lax])
        return sum(v == Verdict.CORRECT for v in result.verdicts)

    # ------------------------------------------------------------------ negatives
    def assistant_negatives(
        self,
        questions: Sequence[str],
        positives: Sequence[str],
        prompts: Sequence[int],
        step: int | None = None,
    ) -> tuple[dict[int, str], dict[str, float]]:
        """The assistant's valid rewrites of `positives[p]` for p in `prompts` (prompt -> normalised text).

        questions, positives: (P,) per prompt (positives as raw rollout text; "" where none). Prompts
        whose rewrites all failed are absent from the result. Metrics: "cooper/negative_attempts",
        "cooper/negative_rejected_no_answer", "cooper/negative_rejected_same_answer",
        "cooper/negative_rejected_undecided", "cooper/negative_accepted_answerless",
        "cooper/negative_accepted_undecided" (counts; the accepted ones only under validity official),
        "timing/cooper_negatives" (seconds).
        """
        start = time.perf_counter()
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"step must be an int >= 0 or None, got {step!r}")
        step = self.calls if step is None else step
        self.calls += 1
        # Normalised for the assistant's prompt and the answer extraction, and to compare each rewrite with what
        # the pairs hold (`algo.selection.assemble_pairs`), not for the RM (its template normalises).
        normalised = {p: normalize_solution(positives[p]) for p in prompts}
        # A positive whose answer cannot be extracted cannot be proved different from anything.
        answers = {p: extract_answer(normalised[p], fallback=self.answer_fallback) if normalised[p] else None
                   for p in prompts}
        for p in prompts:
            if answers[p] is None:
                logger.warning("prompt %d: no answer found in its verified-correct positive; check that the verifier "
                               "and the builder use the same answer_fallback", p)
        wanted = [p for p in prompts if answers[p] is not None]
        negatives, counts = self._rewrite(questions, normalised, answers, wanted, step)
        metrics = {f"cooper/negative_{key}": float(value) for key, value in counts.items()}
        metrics["timing/cooper_negatives"] = time.perf_counter() - start
        return negatives, metrics

    def _rewrite(self, questions, positives: dict[int, str], answers: dict[int, str], wanted: list[int], step: int):
        """Rewrite positives[p] for p in `wanted`, retrying the missing ones; returns the valid ones."""
        negatives: dict[int, str] = {}
        counts = {"attempts": 0, "rejected_no_answer": 0, "rejected_same_answer": 0, "rejected_undecided": 0,
                  "accepted_answerless": 0, "accepted_undecided": 0}
        messages = {p: build_rewrite_messages(questions[p], positives[p], answers[p]) for p in wanted}
        missing = list(wanted)
        for attempt in range(self.config.retries):
            if not missing:
                break
            sampling = SamplingConfig(
                max_new_tokens=self.config.max_new_tokens,
                temperature=self.config.temperature,
                top_p=self.config.top_p,
                n=1,
                seed=self.config.seed + (step * self.config.retries + attempt) * SEED_STRIDE,
            )
            replies = self.assistant.generate([messages[p] for p in missing], sampling)
            if len(replies) != len(missing):
                raise RuntimeError(f"assistant returned {len(replies)} replies for {len(missing)} prompts")
            counts["attempts"] += len(missing)
            # A reply is cleaned before its answer is extracted (text after a chat-control token is another turn)
            # and it is stored as the pair's negative.
            rewrites = [normalize_solution(reply) for reply in replies]
            found = [extract_answer(text, fallback=self.config.answer_fallback) if text else None for text in rewrites]
            checked = [k for k, answer in enumerate(found) if answer is not None]
            equivalent = (
                self.verifier.equivalence_batch([answers[missing[k]] for k in checked], [found[k] for k in checked])
                if checked else []
            )
            if len(equivalent) != len(checked):
                raise RuntimeError(f"verifier returned {len(equivalent)} equivalences for {len(checked)} pairs")
            proofs = dict(zip(checked, equivalent))
            for k, text in enumerate(rewrites):
                has_answer = k in proofs
                if text and text != positives[missing[k]] and \
                        selection.negative_is_valid(self.config.validity, has_answer, proofs.get(k)):
                    negatives[missing[k]] = text
                    counts["accepted_answerless"] += not has_answer
                    counts["accepted_undecided"] += has_answer and proofs[k] is None
                elif not has_answer:
                    counts["rejected_no_answer"] += 1
                elif proofs[k] is None:
                    counts["rejected_undecided"] += 1
                else:
                    counts["rejected_same_answer"] += 1
            missing = [p for p in missing if p not in negatives]
            logger.debug("negatives attempt %d: %d still missing", attempt, len(missing))
        return negatives, counts

    def close(self) -> None:
        """Close the verifier, and the assistant if it has a `close`."""
        try:
            close_assistant = getattr(self.assistant, "close", None)
            if close_assistant is not None:
                close_assistant()
        finally:
            self.verifier.close()

