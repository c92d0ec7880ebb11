"""Rule verifier: does a completion's final answer match the reference? (math-verify underneath)

The completion is parsed by math-verify's own extraction (``math_verify.parse`` with its LaTeX and
expression targets, boxes first), pointed by `extract.extraction_plan` at the ``#### X`` line
when there is one; the parsed objects go to ``verify`` as they are, so grading keeps math-verify's
semantics (interval brackets, bare ``\\frac13``, ``1 000``, relations). Only when math-verify finds
nothing does a bare LaTeX "the answer is X" count (`extract.fallback_phrase`). One departure from math-verify, on
purpose: a final answer that is arithmetic on numerals (``9 - 5``) is not graded as its value; the result the
completion states for it (``9 - 5 = 4``) is, and without one the verdict is INCORRECT
(`extract.unevaluated_arithmetic`: a policy learns to restate the question's expression otherwise). A reference answer
(and either side of an answer-to-answer comparison) is a bare answer string: it is wrapped as
``\\boxed{...}`` and parsed. math-verify's ``verify`` is not symmetric (assignments such as ``x=2`` and
equation/interval conversions are simplified on one side only), so the reference is always passed
as ``gold`` and the completion's answer as ``target``.

math-verify bounds its own work with ``signal.alarm``, which only works in a process's main
thread. `verify_one` therefore passes math-verify's timeouts only when it runs in the main thread
and passes ``None`` elsewhere (threads, Ray actor methods). Those alarms are a soft limit at
best (a huge integer power is one C call that no signal interrupts); the hard per-item deadline
is `VerifierPool`'s, which kills the worker process.
"""

import enum
import functools
import logging
import threading
import time
from dataclasses import dataclass
from itertools import product

from cooper_openrlhf.verify.extract import (
    FALLBACKS,
    extraction_plan,
    fallback_phrase,
    normalize_answer,
    stated_result,
    unevaluated_arithmetic,
)

logger = logging.getLogger(__name__)


class Verdict(str, enum.Enum):
    """Outcome of one verification. Only CORRECT means "verified correct"."""

    CORRECT = "correct"
    INCORRECT = "incorrect"
    NO_ANSWER = "no_answer"  # no final answer found in the completion, or it was empty
    TIMEOUT = "timeout"  # math-verify's alarm fired, or the pool's hard deadline killed the worker
    ERROR = "error"  # math-verify (or a worker) raised unexpectedly; the message is in `error`


@dataclass(frozen=True)
class RuleVerifierConfig:
    """How answers are found and compared.

    answer_fallback: whether unanchored answers count (`extract` module): "last_number" lets
        math-verify take the rightmost LaTeX span or number, "none" keeps only anchored forms
        (box, `####`, "final answer is", "answer:"); without one the verdict is NO_ANSWER.
    parse_timeout_s / compare_timeout_s: math-verify's own alarms (whole seconds, main thread only).
    float_rounding / numeric_precision / strict: passed to `math_verify.verify` unchanged.
    grade_unevaluated_arithmetic: grade an answer such as ``9 - 5`` as its value, as math-verify does (off: the
        result the completion states for it is graded, else INCORRECT; the module docstring says why).
    """

    answer_fallback: str = "last_number"
    parse_timeout_s: int = 2
    compare_timeout_s: int = 2
    float_rounding: int = 6
    numeric_precision: int = 15
    strict: bool = True
    grade_unevaluated_arithmetic: bool = False

    def __post_init__(self) -> None:
        FALLBACKS.check(self.answer_fallback)
        if self.parse_timeout_s < 1 or self.compare_timeout_s < 1:
            raise ValueError("math-verify timeouts are signal.alarm seconds and must be >= 1")


@dataclass(frozen=True)
class VerifyOutcome:
    """One verification: verdict, the answer it judged (None if none was found), seconds spent."""

    verdict: Verdict
    extracted: str | None
    seconds: float
    error: str | None = None


class _MathVerifyTimeout(Exception):
    """math-verify's alarm fired while parsing or comparing."""


def _alarm_allowed() -> bool:
    return threading.current_thread() is threading.main_thread()


def _parse(answer: str, timeout_s: int | None) -> list:
    """math-verify's parse of ``\\boxed{answer}``: [sympy object, string fallback] or fewer."""
    from math_verify import parse
    from math_verify.errors import TimeoutException

    try:
        # raise_on_error=True: otherwise a timeout is indistinguishable from "nothing parsed".
        return parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout_s, raise_on_error=True)
    except TimeoutException as exc:  # a BaseException in math-verify
        raise _MathVerifyTimeout("parse") from exc


# References repeat across the n rollouts of a prompt; sympy objects are immutable, so caching is safe.
_parse_reference = functools.lru_cache(maxsize=1024)(_parse)


def _matches(gold: list, target: list, config: RuleVerifierConfig, timeout_s: int | None) -> bool:
    """True when any (gold, target) parse pair is equal for math-verify.

    Each pair is compared separately so that a timeout is seen (math-verify would log and return
    False). A pair that math-verify cannot compare (sympy raising on incompatible types) counts as
    unequal, as it does in math-verify; a timeout on one pair only counts if no pair matched.
    """
    from math_verify import verify
    from math_verify.errors import TimeoutException

    timed_out = False
    for gold_item, target_item in product(gold, target):
        try:
            if verify(
                gold=gold_item,
                target=target_item,
                float_rounding=config.float_rounding,
                numeric_precision=config.numeric_precision,
                strict=config.strict,
                timeout_seconds=timeout_s,
                raise_on_error=True,
            ):
                return True
        except TimeoutException:
            timed_out = True
        except Exception:
            logger.debug("math-verify could not compare a pair; counted as unequal", exc_info=True)
    if timed_out:
        raise _MathVerifyTimeout("compare")
    return False


def compare_answers(gold_answer: str, target_answer: str, config: RuleVerifierConfig = RuleVerifierConfig()) -> Verdict:
    """CORRECT if `target_answer` equals `gold_answer` for math-verify (gold side first), else INCORRECT.

    Empty answers give NO_ANSWER; an alarm gives TIMEOUT. Answers are strings such as "\\frac{1}{2}".
    """
    gold_norm, target_norm = normalize_answer(gold_answer), normalize_answer(target_answer)
    if gold_norm is None or target_norm is None:
        return Verdict.NO_ANSWER
    timeout_parse = config.parse_timeout_s if _alarm_allowed() else None
    timeout_compare = config.compare_timeout_s if _alarm_allowed() else None
    try:
        gold = _parse_reference(gold_norm, timeout_parse)
        target = _parse(target_norm, timeout_parse)
        if not gold or not target:
            return Verdict.NO_ANSWER
        return Verdict.CORRECT if _matches(gold, target, config, timeout_compare) else Verdict.INCORRECT
    except _MathVerifyTimeout:
        return Verdict.TIMEOUT


def _parse_completion(completion: str, config: RuleVerifierConfig, timeout_s: int | None) -> list:
    """math-verify's parse of the completion's final answer: [sympy object, string] or fewer; [] if none."""
    from math_verify import parse
    from math_verify.errors import TimeoutException

    plan = extraction_plan(completion, config.answer_fallback)
    try:
        parsed = parse(plan.text, plan.configs, parsing_timeout=timeout_s, raise_on_error=True)
    except TimeoutException as exc:
        raise _MathVerifyTimeout("parse") from exc
    if parsed:
        return parsed
    phrase = fallback_phrase(completion, plan)
    return _parse(phrase, timeout_s) if phrase is not None else []


def verify_one(reference: str, completion: str, config: RuleVerifierConfig = RuleVerifierConfig()) -> VerifyOutcome:
    """Verify one completion against its reference answer, in this process.

    `extracted` is the answer math-verify graded, as the string it reports for it. Unexpected
    exceptions from math-verify are logged with their traceback and reported as Verdict.ERROR
    (one odd completion must not end a training step); the message is kept.
    """
    if not isinstance(reference, str) or not isinstance(completion, str):
        raise TypeError(f"reference and completion must be str, got {type(reference)} and {type(completion)}")
    gold_text = normalize_answer(reference)
    if gold_text is None:
        raise ValueError("reference answer is empty")
    start = time.perf_counter()
    extracted = None
    timeout_parse = config.parse_timeout_s if _alarm_allowed() else None
    timeout_compare = config.compare_timeout_s if _alarm_allowed() else None
    try:
        target = _parse_completion(completion, config, timeout_parse)
        if not target:
            return VerifyOutcome(Verdict.NO_ANSWER, None, time.perf_counter() - start)
        extracted = normalize_answer(str(target[-1])) or str(target[-1])
        if not config.grade_unevaluated_arithmetic and unevaluated_arithmetic(extracted):
            result = stated_result(completion, extracted)
            if result is None:  # the computation left to the grader: no result stated
                return VerifyOutcome(Verdict.INCORRECT, extracted, time.perf_counter() - start)
            extracted, target = result, _parse(result, timeout_parse)
        gold = _parse_reference(gold_text, timeout_parse)
        if not gold:
            return VerifyOutcome(Verdict.NO_ANSWER, extracted, time.perf_counter() - start)
        verdict = Verdict.CORRECT if _matches(gold, target, config, timeout_compare) else Verdict.INCORRECT
    except _MathVerifyTimeout:
        return VerifyOutcome(Verdict.TIMEOUT, extracted, time.perf_counter() - start)
    except Exception as exc:
        logger.warning("rule verifier raised on reference %.80r", reference, exc_info=True)
        return VerifyOutcome(Verdict.ERROR, extracted, time.perf_counter() - start, error=repr(exc))
    return VerifyOutcome(verdict, extracted, time.perf_counter() - start)


def equivalence_outcome(answer_a: str, answer_b: str, config: RuleVerifierConfig = RuleVerifierConfig()) -> VerifyOutcome:
    """Whether two answers are the same, as a VerifyOutcome (CORRECT = equivalent).

    Checked in both directions (each answer as gold once): equivalent if either says so. This is
    the conservative choice for Cooper's negatives: wrongly calling a correct rewrite "different"
    would train the RM on a mislabelled pair, while wrongly calling it "equivalent" costs a retry.
    """
    start = time.perf_counter()
    try:
        forward = compare_answers(answer_a, answer_b, config)
        verdict = forward if forward == Verdict.CORRECT else _combine(forward, compare_answers(answer_b, answer_a, config))
    except Exception as exc:
        logger.warning("answer comparison raised", exc_info=True)
        return VerifyOutcome(Verdict.ERROR, answer_b, time.perf_counter() - start, error=repr(exc))
    return VerifyOutcome(verdict, answer_b, time.perf_counter() - start)


def _combine(forward: Verdict, backward: Verdict) -> Verdict:
    if Verdict.CORRECT in (forward, backward):
        return Verdict.CORRECT
    for undecided in (Verdict.NO_ANSWER, Verdict.TIMEOUT):
        if undecided in (forward, backward):
            return undecided
    return Verdict.INCORRECT


def equivalence_from_verdict(verdict: Verdict) -> bool | None:
    """True (equivalent), False (provably different) or None (undecided: empty, timeout, error)."""
    return {Verdict.CORRECT: True, Verdict.INCORRECT: False}.get(verdict)


def answers_equivalent(answer_a: str, answer_b: str, config: RuleVerifierConfig = RuleVerifierConfig()) -> bool | None:
    """True if the answers are equivalent (either side as gold), False if provably different, else None.

    Cooper keeps a rewritten negative only when this is False against the positive's answer.
    """
    return equivalence_from_verdict(equivalence_outcome(answer_a, answer_b, config).verdict)
