"""Measure verifiers against gold labels: math-verify, an LLM judge and reward models, one table.

The one place where verifiers are run over labelled triples and scored against gold: `verifyrm
compare` (a VerifyRM next to math-verify alone and the judge alone, on annotation rows) and
`cli/eval_verifier` (one verifier on VerifyBench rows) both use it. Rows are any objects with
`question`, `reference` and `completion` (`rm.data.ScoringRow`, `data.records.VerifyExample`).

Verifiers: `rule_verdicts` (math-verify in `VerifierPool`: only CORRECT counts as predicted
correct), `judge_verdicts` (an LLM judge; UNDECIDED counts as predicted incorrect) and
`rm_predictions` (a reward model: correct when sigmoid(logit) >= threshold).

For annotation rows the gold label of a row comes from one of `GOLD_SOURCES`:
  label         the row's `label` (the annotation's agreement label; math-verify and the judge are right
                on every kept row by construction, so this measures the RM against its own training signal)
  gold_correct  a boolean field from an independent source (e.g. human labels in VerifyBench format)
  exact         the completion's final answer in an anchored form (last \\boxed{}, "####", "the answer is";
                no last-number fallback) equals the reference as a string after light normalisation. Sound
                where references are plain numbers, as in the built-in synthetic arithmetic set; it is
                independent of both math-verify's equivalence checks and the judge, and it is strict about
                the answer format the generators were asked for.
The judge's verdicts of annotation rows are read from the rows (`judge_verdict`, as annotate recorded
them) unless a judge model is given, in which case it is re-run.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cooper_openrlhf.runtime.registry import Registry
from cooper_openrlhf.rm.data import RecipeDataError, ScoringRow
from cooper_openrlhf.verify.extract import extract_answer, normalize_answer
from cooper_openrlhf.verify.judge import JudgeVerdict
from cooper_openrlhf.verify.metrics import BinaryMetrics, binary_metrics, grouped_metrics, verdict_is_positive
from cooper_openrlhf.verify.rule import Verdict

logger = logging.getLogger(__name__)

GOLD_SOURCES = Registry("gold source", ("label", "gold_correct", "exact"))


def exact_gold(reference: str, completion: str) -> bool:
    """True when the anchored final answer of `completion` equals `reference` (both normalised) as strings."""
    answer = extract_answer(completion, fallback="none")
    return answer is not None and answer == normalize_answer(reference)


def gold_labels(rows: list[ScoringRow], source: str) -> list[bool]:
    """Gold per row from `source` (one of GOLD_SOURCES); a row without the needed field raises naming it."""
    GOLD_SOURCES.check(source)
    gold = []
    for item in rows:
        if source == "exact":
            gold.append(exact_gold(item.reference, item.completion))
            continue
        value = item.row.get(source)
        if source == "label" and value in (0, 1) and not isinstance(value, float):
            value = bool(value)
        if not isinstance(value, bool):
            raise RecipeDataError(
                f"{item.where}: field {source!r} is missing or not 0/1/true/false (needed by --gold {source})"
            )
        gold.append(value)
    return gold


@dataclass
class Comparison:
    """Per verifier: metrics over all rows and per group ("kept" / "rejected" annotation rows, answer types, ...)."""

    n: int
    gold_source: str
    overall: dict[str, BinaryMetrics]
    by_group: dict[str, dict[str, BinaryMetrics]]

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "gold_source": self.gold_source,
            "overall": {name: m.to_dict() for name, m in self.overall.items()},
            "by_group": {name: {g: m.to_dict() for g, m in groups.items()} for name, groups in self.by_group.items()},
        }


class Triple(Protocol):
    """A row to verify: `rm.data.ScoringRow`, `data.records.VerifyExample`, ..."""

    question: str
    reference: str
    completion: str


def _columns(rows: Sequence[Triple]) -> tuple[list[str], list[str], list[str]]:
    return [item.question for item in rows], [item.reference for item in rows], [item.completion for item in rows]


def rule_verdicts(rows: Sequence[Triple], workers: int | None, timeout_s: float) -> list[Verdict]:
    """math-verify's verdict per row, in a `VerifierPool` of `workers` processes with a hard per-row deadline."""
    from cooper_openrlhf.verify.pool import VerifierPool

    with VerifierPool(num_workers=workers, deadline_s=timeout_s) as pool:
        return pool.verify_batch([item.reference for item in rows], [item.completion for item in rows]).verdicts


def rule_predictions(rows: Sequence[Triple], workers: int | None, timeout_s: float) -> list[bool]:
    """Predicted correct per row by math-verify: its verdict is CORRECT (`rule_verdicts`)."""
    return [verdict_is_positive(v) for v in rule_verdicts(rows, workers, timeout_s)]


def judge_verdicts(rows: Sequence[Triple], judge_model: str | None, engine: str, max_new_tokens: int,
                   engine_options: dict) -> list[JudgeVerdict]:
    """The judge's verdict per row: by `judge_model`, else as recorded in annotation rows (`ScoringRow`s' `judge_verdict`)."""
    if judge_model is None:
        missing = [item.where for item in rows if item.row.get("judge_verdict") not in {v.value for v in JudgeVerdict}]
        if missing:
            raise RecipeDataError(
                f"{missing[0]}: no recorded 'judge_verdict' ({len(missing)} rows); pass --judge MODEL to run the judge"
            )
        return [JudgeVerdict(item.row["judge_verdict"]) for item in rows]
    from cooper_openrlhf.engines import make_engine
    from cooper_openrlhf.engines.base import SamplingConfig
    from cooper_openrlhf.verify.judge import LLMJudge

    judge = LLMJudge(make_engine(engine, judge_model, **engine_options), SamplingConfig(max_new_tokens=max_new_tokens))
    return [judgement.verdict for judgement in judge.judge(*_columns(rows))]


def judge_predictions(rows: Sequence[Triple], judge_model: str | None, engine: str, max_new_tokens: int,
                      engine_options: dict) -> list[bool]:
    """Predicted correct per row by the judge: its verdict is YES (`judge_verdicts`)."""
    verdicts = judge_verdicts(rows, judge_model, engine, max_new_tokens, engine_options)
    return [verdict == JudgeVerdict.YES for verdict in verdicts]


def rm_scores(rows: Sequence[Triple], model: str, batch_size: int, max_length: int | None, device: str) -> list[float]:
    """sigmoid(logit) per row; max_length None: what the export records (`rm.scorer.RMScorer`)."""
    from cooper_openrlhf.rm.scorer import RMScorer

    scorer = RMScorer.load(model, device=device, max_length=max_length, batch_size=batch_size)
    logger.info("scoring %d rows with %s (template %s, max_length %d)", len(rows), model, scorer.template_version,
                scorer.max_length)
    return list(scorer.score(*_columns(rows)))


def rm_predictions(rows: Sequence[Triple], model: str, threshold: float, batch_size: int, max_length: int | None,
                   device: str) -> list[bool]:
    """sigmoid(logit) >= threshold per row (`rm_scores`)."""
    return [score >= threshold for score in rm_scores(rows, model, batch_size, max_length, device)]


def annotation_groups(rows: Sequence[ScoringRow]) -> list[str]:
    """"kept" or "rejected" per annotation row (a rejected row records its `reason`)."""
    return ["kept" if "label" in item.row and "reason" not in item.row else "rejected" for item in rows]


def compare(rows: Sequence[Triple], gold: list[bool], predictions: dict[str, list[bool]], gold_source: str,
            groups: list[str] | None = None) -> Comparison:
    """Metrics of each verifier's predictions against `gold`, overall and per group (default: `annotation_groups`)."""
    groups = annotation_groups(rows) if groups is None else groups
    return Comparison(
        n=len(rows),
        gold_source=gold_source,
        overall={name: binary_metrics(predicted, gold) for name, predicted in predictions.items()},
        by_group={name: grouped_metrics(predicted, gold, groups) for name, predicted in predictions.items()},
    )


def format_comparison(result: Comparison) -> str:
    """One line per verifier and group ("all" first): n, accuracy, precision, recall, F1 and the confusion counts."""
    name_width = max([8, *map(len, result.overall)])
    group_width = max([5, *(len(group) for groups in result.by_group.values() for group in groups)])
    header = (f"{'verifier':<{name_width}} {'group':<{group_width}} {'n':>6} {'acc':>7} {'prec':>7} {'recall':>7} "
              f"{'f1':>7} {'tp':>6} {'fp':>6} {'tn':>6} {'fn':>6}")
    lines = [f"gold: {result.gold_source}", header, "-" * len(header)]
    for name, overall in result.overall.items():
        for group, m in [("all", overall), *result.by_group[name].items()]:
            c = m.confusion
            lines.append(f"{name:<{name_width}} {group:<{group_width}} {m.n:>6} {m.accuracy:>7.4f} {m.precision:>7.4f} "
                         f"{m.recall:>7.4f} {m.f1:>7.4f} {c.tp:>6} {c.fp:>6} {c.tn:>6} {c.fn:>6}")
    return "\n".join(lines)
