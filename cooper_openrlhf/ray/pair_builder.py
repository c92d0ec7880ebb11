"""PairBuilder: verify a step's rollouts and turn them into Cooper's masked preference pairs.

Pure Python (no Ray import): `ray/pair_actor.py` wraps it in a Ray actor, and the tests drive it
with a fake engine and the real verifier pool in milliseconds.

One step (arXiv 2508.05613, sec. 3.2):
1. `verify`: the rule verifier judges every rollout against its reference; only
   `Verdict.CORRECT` counts as verified correct (timeouts, errors and missing answers do not).
2. `build_pairs`: per prompt, the positive is its first verified-correct rollout in batch order
   (`algo.pairs.select_positives`). The assistant rewrites each positive (`algo.negatives`);
   attempt k sends the prompts still without a valid negative in ONE `engine.generate` call, up
   to `NegativeConfig.retries` attempts. A rewrite is a valid negative only when an answer can
   be extracted from it AND the verifier says it is provably different from the positive's
   answer (`equivalence_batch` is False; equivalent or undecided are rejected: a negative that
   might be correct would train the RM on a mislabelled pair).

Seeds: attempt k of step t samples with seed `config.seed + (t * retries + k) * SEED_STRIDE`
(the engine adds each request's index), so the same step of a run reproduces its negatives.
`t` is the `step` the caller passes (the trainer's global step, which also makes a resumed run
reproduce), else the number of earlier `build_pairs` calls.
"""

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from cooper_openrlhf.algo.negatives import NegativeConfig, build_rewrite_messages, clean_rewrite
from cooper_openrlhf.algo.pairs import NO_POSITIVE, PairBatch, select_positives
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
    """Verifies rollouts and builds one PairBatch per step; owns `verifier` (closed by `close`).

    verifier: a `VerifierPool` (or anything with its `verify_batch` / `equivalence_batch`).
    assistant: the engine that rewrites positives into negatives.
    answer_fallback: how answers are extracted from positives (`verify.extract`); use the verifier's
        own `RuleVerifierConfig.answer_fallback`. Rewrites use `config.answer_fallback`.
    """

    def __init__(
        self,
        verifier: Verifier,
        assistant: GenerationEngine,
        config: NegativeConfig,
        answer_fallback: str = "last_number",
    ):
        if not isinstance(config, NegativeConfig):
            raise TypeError(f"config must be a NegativeConfig, got {type(config).__name__}")
        for name, value in (("answer_fallback", answer_fallback), ("config.answer_fallback", config.answer_fallback)):
            if value not in FALLBACKS:
                raise ValueError(f"unknown {name} {value!r}; valid: {list(FALLBACKS)}")
        self.verifier = verifier
        self.assistant = assistant
        self.config = config
        self.answer_fallback = answer_fallback
        self.calls = 0  # build_pairs calls so far: the default seed step

    # ------------------------------------------------------------------ verify
    def verify(self, references: list[str], completions: list[str]) -> tuple[list[bool], dict[str, float]]:
        """verified_correct per rollout (only Verdict.CORRECT is True) and metrics.

        Metrics: "cooper/verified_accuracy" (fraction correct, 0 for an empty batch),
        "cooper/verify_timeouts", "cooper/verify_no_answer", "cooper/verify_errors" (counts),
        "timing/cooper_verify" (seconds).
        """
        start = time.perf_counter()
        result = self.verifier.verify_batch(list(references), list(completions))
        verdicts = result.verdicts
        if len(verdicts) != len(completions):
            raise RuntimeError(f"verifier returned {len(verdicts)} verdicts for {len(completions)} completions")
        correct = [verdict == Verdict.CORRECT for verdict in verdicts]
        metrics = {
            "cooper/verified_accuracy": sum(correct) / len(correct) if correct else 0.0,
            "cooper/verify_timeouts": float(sum(v == Verdict.TIMEOUT for v in verdicts)),
            "cooper/verify_no_answer": float(sum(v == Verdict.NO_ANSWER for v in verdicts)),
            "cooper/verify_errors": float(sum(v == Verdict.ERROR for v in verdicts)),
            "timing/cooper_verify": time.perf_counter() - start,
        }
        return correct, metrics

    # ------------------------------------------------------------------ pairs
    def build_pairs(
        self,
        questions: list[str],
        references: list[str],
        completions: list[str],
        verified_correct: list[bool],
        n_samples_per_prompt: int,
        step: int | None = None,
    ) -> tuple[PairBatch, dict[str, float]]:
        """One PairBatch slot per prompt, in prompt order, and metrics.

        Inputs are flat and prompt-grouped (P * n, the n rollouts of a prompt contiguous);
        questions/references repeat per rollout and each group's first is used. Never raises
        for a step without positives or valid negatives: those slots are `valid=False`.

        Metrics: "cooper/prompts_with_positive" (count), "cooper/valid_pair_rate" (valid / P),
        "cooper/negative_success_rate" (valid / prompts with a positive; 0 when none),
        "cooper/negative_attempts" (rewrites requested over all attempts),
        "cooper/negative_rejected_no_answer", "cooper/negative_rejected_same_answer",
        "cooper/negative_rejected_undecided" (counts of rejected rewrites by reason),
        "timing/cooper_negatives" (seconds).
        """
        start = time.perf_counter()
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"step must be an int >= 0 or None, got {step!r}")
        flat = (questions, references, completions, verified_correct)
        if len({len(items) for items in flat}) != 1:
            raise ValueError(
                "questions, references, completions and verified_correct must have one entry per rollout; "
                f"got lengths {[len(items) for items in flat]}"
            )
        positive_index = select_positives(verified_correct, n_samples_per_prompt)  # validates the grouping
        n = n_samples_per_prompt
        group_questions = self._group_firsts(questions, n, "question")
        group_references = self._group_firsts(references, n, "reference")
        num_prompts = len(positive_index)
        positives = [completions[i] if i != NO_POSITIVE else "" for i in positive_index]

        # Positives whose answer cannot be extracted cannot be proved different from anything.
        positive_answers: list[str | None] = [None] * num_prompts
        for p, i in enumerate(positive_index):
            if i == NO_POSITIVE:
                continue
            positive_answers[p] = extract_answer(positives[p], fallback=self.answer_fallback)
            if positive_answers[p] is None:
                logger.warning("prompt %d: no answer found in its verified-correct positive (rollout %d); "
                               "check that the verifier and the builder use the same answer_fallback", p, i)
        wanted = [p for p in range(num_prompts) if positive_answers[p] is not None]

        step = self.calls if step is None else step
        self.calls += 1
        negatives, counts = self._negatives(group_questions, positives, positive_answers, wanted, step)
        valid = [bool(negatives[p]) for p in range(num_prompts)]
        batch = PairBatch(group_questions, group_references, positives, negatives, valid, positive_index)

        with_positive = sum(i != NO_POSITIVE for i in positive_index)
        num_valid = batch.num_valid
        if with_positive and not num_valid:
            logger.warning(
                "no valid negative for any of %d prompts with a positive after %d attempts (%d rewrites: "
                "%d without an answer, %d with the same answer, %d undecided); the RM update is masked out",
                with_positive, self.config.retries, counts["attempts"], counts["no_answer"], counts["same"],
                counts["undecided"],
            )
        metrics = {
            "cooper/prompts_with_positive": float(with_positive),
            "cooper/valid_pair_rate": num_valid / num_prompts if num_prompts else 0.0,
            "cooper/negative_success_rate": num_valid / with_positive if with_positive else 0.0,
            "cooper/negative_attempts": float(counts["attempts"]),
            "cooper/negative_rejected_no_answer": float(counts["no_answer"]),
            "cooper/negative_rejected_same_answer": float(counts["same"]),
            "cooper/negative_rejected_undecided": float(counts["undecided"]),
            "timing/cooper_negatives": time.perf_counter() - start,
        }
        return batch, metrics

    def _negatives(
        self,
        questions: list[str],
        positives: list[str],
        positive_answers: list[str | None],
        wanted: list[int],
        step: int,
    ) -> tuple[list[str], dict[str, int]]:
        """Rewrite positives[p] for p in `wanted`, retrying the missing ones; "" where none was valid."""
        negatives = [""] * len(positives)
        counts = {"attempts": 0, "no_answer": 0, "same": 0, "undecided": 0}
        messages = {p: build_rewrite_messages(questions[p], positives[p], positive_answers[p]) for p in wanted}
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
            rewrites = [clean_rewrite(reply) for reply in replies]
            answers = [extract_answer(text, fallback=self.config.answer_fallback) if text else None for text in rewrites]
            checked = [k for k, answer in enumerate(answers) if answer is not None]
            counts["no_answer"] += len(missing) - len(checked)
            equivalent = (
                self.verifier.equivalence_batch(
                    [positive_answers[missing[k]] for k in checked], [answers[k] for k in checked]
                )
                if checked
                else []
            )
            if len(equivalent) != len(checked):
                raise RuntimeError(f"verifier returned {len(equivalent)} equivalences for {len(checked)} pairs")
            for k, same in zip(checked, equivalent):
                if same is False:
                    negatives[missing[k]] = rewrites[k]
                elif same is None:
                    counts["undecided"] += 1
                else:
                    counts["same"] += 1
            missing = [p for p in missing if not negatives[p]]
            logger.debug("negatives attempt %d: %d still missing", attempt, len(missing))
        return negatives, counts

    @staticmethod
    def _group_firsts(items: Sequence[str], n: int, name: str) -> list[str]:
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

    def close(self) -> None:
        """Close the verifier, and the assistant if it has a `close`."""
        try:
            close_assistant = getattr(self.assistant, "close", None)
            if close_assistant is not None:
                close_assistant()
        finally:
            self.verifier.close()
