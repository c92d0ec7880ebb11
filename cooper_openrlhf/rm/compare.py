"""Measure a VerifyRM next to math-verify alone and the LLM judge alone, on the same labelled rows.

Rows are `annotate` outputs (kept and/or rejected files) or any JSON Lines with question, reference,
completion. The gold label of a row comes from one of `GOLD_SOURCES`:
  label         the row's `label` (the annotation's agreement label; math-verify and the judge are right
                on every kept row by construction, so this measures the RM against its own training signal)
  gold_correct  a boolean field from an independent source (e.g. human labels in VerifyBench format)
  exact         the completion's final answer in an anchored form (last \\boxed{}, "####", "the answer is";
                no last-number fallback) equals the reference as a string after light normalisation. Sound
                where references are plain numbers, as in the built-in synthetic arithmetic set; it is
                independent of both math-verify's equivalence checks and the judge, and it is strict about
                the answer format the generators were asked for.
The rule verifier is re-run (math-verify in `VerifierPool`); the judge's verdicts are read from the rows
(`judge_verdict`, as annotate recorded them) unless a judge model is given, in which case it is re-run.
"""

import logging
from dataclasses import dataclass

from cooper_openrlhf.rm.data import RecipeDataError, ScoringRow
from cooper_openrlhf.verify.extract import extract_answer, normalize_answer
from cooper_openrlhf.verify.metrics import BinaryMetrics, binary_metrics, grouped_metrics, verdict_is_positive

logger = logging.getLogger(__name__)

GOLD_SOURCES = ("label", "gold_correct", "exact")


def exact_gold(reference: str, completion: str) -> bool:
    """True when the anchored final answer of `completion` equals `reference` (both normalised) as strings."""
    answer = extract_answer(completion, fallback="none")
    return answer is not None and answer == normalize_answer(reference)


def gold_labels(rows: list[ScoringRow], source: str) -> list[bool]:
    """Gold per row from `source` (one of GOLD_SOURCES); a row without the needed field raises naming it."""
    if source not in GOLD_SOURCES:
        raise KeyError(f"unknown gold source {source!r}; valid: {list(GOLD_SOURCES)}")
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
    """Per verifier: metrics over all rows and per group ("kept" / "rejected" annotation rows)."""

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


def _columns(rows: list[ScoringRow]) -> tuple[list[str], list[str], list[str]]:
    return [item.question for item in rows], [item.reference for item in rows], [item.completion for item in rows]


def rule_predictions(rows: list[ScoringRow], workers: int, timeout_s: float) -> list[bool]:
    from cooper_openrlhf.verify.pool import VerifierPool

    with VerifierPool(num_workers=workers, deadline_s=timeout_s) as pool:
        result = pool.verify_batch([item.reference for item in rows], [item.completion for item in rows])
    return [verdict_is_positive(v) for v in result.verdicts]


def judge_predictions(rows: list[ScoringRow], judge_model: str | None, engine: str, max_new_tokens: int,
                      engine_options: dict) -> list[bool]:
    from cooper_openrlhf.verify.judge import JudgeVerdict

    if judge_model is None:
        missing = [item.where for item in rows if item.row.get("judge_verdict") not in {v.value for v in JudgeVerdict}]
        if missing:
            raise RecipeDataError(
                f"{missing[0]}: no recorded 'judge_verdict' ({len(missing)} rows); pass --judge MODEL to run the judge"
            )
        return [item.row["judge_verdict"] == JudgeVerdict.YES.value for item in rows]
    from cooper_openrlhf.engines import make_engine
    from cooper_openrlhf.engines.base import SamplingConfig
    from cooper_openrlhf.verify.judge import LLMJudge

    judge = LLMJudge(make_engine(engine, judge_model, **engine_options), SamplingConfig(max_new_tokens=max_new_tokens))
    judgements = judge.judge(*_columns(rows))
    return [j.verdict == JudgeVerdict.YES for j in judgements]


def rm_predictions(rows: list[ScoringRow], model: str, threshold: float, batch_size: int, max_length: int | None,
                   device: str) -> list[bool]:
    from cooper_openrlhf.verify.rm_scorer import RMScorer

    scorer = RMScorer(model, device=device, max_length=max_length, batch_size=batch_size)
    scores = scorer.score(*_columns(rows))
    return [score >= threshold for score in scores]


def compare(rows: list[ScoringRow], gold: list[bool], predictions: dict[str, list[bool]], gold_source: str) -> Comparison:
    """Metrics of each verifier's predictions against `gold`, overall and per annotation group."""
    groups = ["kept" if "label" in item.row and "reason" not in item.row else "rejected" for item in rows]
    return Comparison(
        n=len(rows),
        gold_source=gold_source,
        overall={name: binary_metrics(predicted, gold) for name, predicted in predictions.items()},
        by_group={name: grouped_metrics(predicted, gold, groups) for name, predicted in predictions.items()},
    )


def format_comparison(result: Comparison) -> str:
    header = (f"{'verifier':<14} {'rows':<9} {'n':>5} {'acc':>7} {'prec':>7} {'recall':>7} {'f1':>7} "
              f"{'tp':>5} {'fp':>5} {'tn':>5} {'fn':>5}")
    lines = [f"gold: {result.gold_source}", header, "-" * len(header)]
    for name, overall in result.overall.items():
        for group, m in [("all", overall), *result.by_group[name].items()]:
            c = m.confusion
            lines.append(f"{name:<14} {group:<9} {m.n:>5} {m.accuracy:>7.4f} {m.precision:>7.4f} {m.recall:>7.4f} "
                         f"{m.f1:>7.4f} {c.tp:>5} {c.fp:>5} {c.tn:>5} {c.fn:>5}")
    return "\n".join(lines)
