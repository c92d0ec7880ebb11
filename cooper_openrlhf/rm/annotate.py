"""Hybrid annotation (Cooper's VerifyRM data, arXiv 2508.05613 sec. 3.1): label triples where two verifiers agree.

For every generator model and every question, sample k completions (the generator is asked to put its
final answer in \\boxed{}), then label each completion twice: with the rule verifier (math-verify in
`verify.pool.VerifierPool`) and with an LLM judge (`verify.judge.LLMJudge`). A triple is kept, with
label 1 or 0, only when both verifiers decided and agree; all others go to a side file with the reason.

Verdicts: the rule verifier decides with CORRECT (1), INCORRECT or NO_ANSWER (0); TIMEOUT and ERROR are
undecided. The judge decides with YES (1) or NO (0); UNDECIDED is undecided. Empty completions are
counted and dropped before either verifier sees them.

Files, for `--out data.jsonl`:
  data.jsonl                  kept rows: question, reference, completion, label, generator, rule_verdict,
                              judge_verdict, plus rule_answer, judge_reply, source, index, sample
  data.rejected.jsonl         every other non-empty completion, same fields plus `reason`, without `label`
  data.progress.jsonl         header (settings and a fingerprint of the prompts), then one line per done chunk
  data.summary.json           the final summary (also printed)

Resumable: work is cut into chunks of (generator, `chunk_size` consecutive questions), done
generator by generator (one generator model in memory at a time, besides the judge). A chunk's rows
are appended and fsynced, then a progress line with the byte size of both files and the chunk's counts
is appended and fsynced. A restart checks that the settings are the same, truncates both files to the
last recorded sizes (dropping rows of a chunk that was cut short) and skips the recorded chunks.
Sampling is seeded per chunk from (seed, generator index, first question), so the output of a restarted
run is byte-identical to that of an uninterrupted one.
"""

import gc
import hashlib
import json
import logging
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cooper_openrlhf.data.records import MathProblem
from cooper_openrlhf.engines.base import GenerationEngine, Prompt, SamplingConfig
from cooper_openrlhf.verify.judge import JudgeVerdict, LLMJudge
from cooper_openrlhf.verify.metrics import binary_metrics
from cooper_openrlhf.verify.rule import Verdict

logger = logging.getLogger(__name__)

GENERATOR_SYSTEM = (
    "You are a careful math solver. Solve the problem with short reasoning, then give the final answer "
    "in \\boxed{}, for example \\boxed{42}."
)
# One worked example shown before each question: small models copy its format (short, boxed answer).
GENERATOR_EXAMPLE = ("What is 12 + 30?", "12 + 30 = 42. The answer is \\boxed{42}.")
RULE_DECIDED = {Verdict.CORRECT: 1, Verdict.INCORRECT: 0, Verdict.NO_ANSWER: 0}
JUDGE_DECIDED = {JudgeVerdict.YES: 1, JudgeVerdict.NO: 0}
COUNT_KEYS = ("generated", "empty", "kept", "kept_correct", "rule_yes_judge_no", "rule_no_judge_yes",
              "rule_undecided", "judge_undecided")


class AnnotateError(RuntimeError):
    """Annotation cannot start or go on (a model that does not load, a progress file from other settings)."""


@dataclass(frozen=True)
class AnnotateConfig:
    """Everything that decides the output; a restart must use the same values.

    samples_per_question: k completions per (question, generator). chunk_size: questions per chunk (the
    unit of progress and of seeding). engine_options: keyword arguments for `engines.make_engine`.
    """

    generators: tuple[str, ...]
    judge: str
    engine: str = "hf"
    samples_per_question: int = 4
    max_new_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    judge_max_new_tokens: int = 64
    chunk_size: int = 8
    seed: int = 0
    verifier_timeout_s: float = 5.0
    engine_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.generators:
            raise ValueError("need at least one generator model")
        if self.samples_per_question < 1 or self.chunk_size < 1:
            raise ValueError("samples_per_question and chunk_size must be >= 1")
        if self.temperature == 0 and self.samples_per_question > 1:
            logger.warning("temperature 0 gives %d identical completions per question", self.samples_per_question)


@dataclass(frozen=True)
class Chunk:
    generator_index: int
    start: int  # first question index (inclusive)
    end: int  # last question index (exclusive)

    def key(self) -> tuple[int, int]:
        return self.generator_index, self.start


def plan_chunks(n_questions: int, config: AnnotateConfig) -> list[Chunk]:
    """All chunks in processing order: generator by generator, questions in order."""
    return [
        Chunk(g, start, min(start + config.chunk_size, n_questions))
        for g in range(len(config.generators))
        for start in range(0, n_questions, config.chunk_size)
    ]


def chunk_seed(seed: int, chunk: Chunk) -> int:
    """A sampling seed that depends only on (seed, generator index, first question): the same on every restart."""
    digest = hashlib.sha256(f"{seed}:{chunk.generator_index}:{chunk.start}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def generator_prompt(question: str, chat: bool) -> Prompt:
    """A chat (system, one worked example, the question) or, for models without a chat template, plain text."""
    example_q, example_a = GENERATOR_EXAMPLE
    if chat:
        return [
            {"role": "system", "content": GENERATOR_SYSTEM},
            {"role": "user", "content": example_q},
            {"role": "assistant", "content": example_a},
            {"role": "user", "content": question},
        ]
    return f"{GENERATOR_SYSTEM}\n\nQuestion: {example_q}\nSolution: {example_a}\n\nQuestion: {question}\nSolution:"


def prompts_fingerprint(problems: list[MathProblem]) -> str:
    digest = hashlib.sha256()
    for problem in problems:
        digest.update(json.dumps([problem.question, problem.reference]).encode())
    return digest.hexdigest()


def label_chunk(
    problems: list[MathProblem],
    completions: list[str],
    k: int,
    rule_outcomes: list,
    judgements: list,
    generator: str,
) -> tuple[list[dict], list[dict], Counter]:
    """(kept rows, rejected rows, counts) for one chunk. Pure: verdicts in, rows out.

    completions[i * k + s] is sample s of problems[i]; rule_outcomes and judgements hold one entry per
    non-empty completion, in the same order.
    """
    kept, rejected, counts = [], [], Counter({key: 0 for key in COUNT_KEYS})
    verdicts = iter(zip(rule_outcomes, judgements))
    for position, completion in enumerate(completions):
        problem, sample = problems[position // k], position % k
        counts["generated"] += 1
        if not completion.strip():
            counts["empty"] += 1
            continue
        outcome, judgement = next(verdicts)
        rule, judge = RULE_DECIDED.get(outcome.verdict), JUDGE_DECIDED.get(judgement.verdict)
        row = {
            "question": problem.question,
            "reference": problem.reference,
            "completion": completion,
            "generator": generator,
            "rule_verdict": outcome.verdict.value,
            "judge_verdict": judgement.verdict.value,
            "rule_answer": outcome.extracted,
            "judge_reply": judgement.reply,
            "source": problem.source,
            "index": problem.index,
            "sample": sample,
        }
        if rule is None or judge is None:
            reason = "rule_undecided" if rule is None else "judge_undecided"
        elif rule != judge:
            reason = "rule_yes_judge_no" if rule else "rule_no_judge_yes"
        else:
            reason = None
        if reason is None:
            counts["kept"] += 1
            counts["kept_correct"] += rule
            kept.append({**row, "label": rule})
        else:
            counts[reason] += 1
            rejected.append({**row, "reason": reason})
    if next(verdicts, None) is not None:
        raise ValueError("more verdicts than non-empty completions")
    return kept, rejected, counts


def summarize(per_generator: dict[str, Counter]) -> dict:
    """Counts per generator, agreement rate, label balance, and the rule verifier measured against the judge.

    On the disagreements alone the rule verifier's precision and recall against the judge are 0 by
    construction, so they are measured over every triple both decided: the disagreements are exactly the
    false positives (rule yes, judge no) and false negatives (rule no, judge yes).
    """
    total = Counter({key: 0 for key in COUNT_KEYS})
    for counts in per_generator.values():
        total.update(counts)
    decided = total["kept"] + total["rule_yes_judge_no"] + total["rule_no_judge_yes"]
    tp, tn = total["kept_correct"], total["kept"] - total["kept_correct"]
    fp, fn = total["rule_yes_judge_no"], total["rule_no_judge_yes"]
    rule_vs_judge = binary_metrics([True] * tp + [True] * fp + [False] * fn + [False] * tn,
                                   [True] * tp + [False] * fp + [True] * fn + [False] * tn)
    return {
        "per_generator": {name: dict(counts) for name, counts in per_generator.items()},
        "total": dict(total),
        "agreement_rate": total["kept"] / decided if decided else 0.0,
        "kept_fraction": total["kept"] / total["generated"] if total["generated"] else 0.0,
        "label_balance": {"correct": tp, "incorrect": tn,
                          "correct_fraction": tp / total["kept"] if total["kept"] else 0.0},
        "disagreements": {"rule_yes_judge_no": fp, "rule_no_judge_yes": fn},
        "rule_vs_judge": rule_vs_judge.to_dict(),
    }


def format_summary(summary: dict) -> str:
    lines = [f"{'generator':<40} {'generated':>9} {'empty':>6} {'kept':>6} {'correct':>8} "
             f"{'R+J-':>6} {'R-J+':>6} {'R?':>5} {'J?':>5}"]
    for name, c in [*summary["per_generator"].items(), ("ALL", summary["total"])]:
        lines.append(
            f"{name[-40:]:<40} {c['generated']:>9} {c['empty']:>6} {c['kept']:>6} {c['kept_correct']:>8} "
            f"{c['rule_yes_judge_no']:>6} {c['rule_no_judge_yes']:>6} {c['rule_undecided']:>5} {c['judge_undecided']:>5}"
        )
    rvj, balance = summary["rule_vs_judge"], summary["label_balance"]
    lines.append(
        f"agreement {summary['agreement_rate']:.3f} (of triples both decided); kept {summary['kept_fraction']:.3f} "
        f"of generated; labels: {balance['correct']} correct / {balance['incorrect']} incorrect"
    )
    lines.append(f"rule verifier vs judge: precision {rvj['precision']:.3f} recall {rvj['recall']:.3f} "
                 f"(R+J- = rule yes, judge no; R?/J? = undecided)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ files
def output_paths(out: str | Path) -> dict[str, Path]:
    out = Path(out)
    stem = out.with_suffix("") if out.suffix == ".jsonl" else out
    return {
        "kept": out,
        "rejected": stem.with_name(stem.name + ".rejected.jsonl"),
        "progress": stem.with_name(stem.name + ".progress.jsonl"),
        "summary": stem.with_name(stem.name + ".summary.json"),
    }


def _append(path: Path, text: str) -> int:
    """Append, flush and fsync; returns the file's size afterwards."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
        return handle.tell()


def _read_progress(path: Path) -> tuple[dict | None, list[dict]]:
    """(header, chunk records); a last line cut short by a crash is ignored (its chunk is redone)."""
    if not path.exists():
        return None, []
    lines = path.read_text(encoding="utf-8").split("\n")
    complete, partial = lines[:-1], lines[-1]
    if partial:
        logger.warning("%s ends with a partial line (a crash while recording); that chunk is redone", path)
    records = [json.loads(line) for line in complete if line]
    if not records or records[0].get("kind") != "header":
        raise AnnotateError(f"{path} has no header line; it is not an annotate progress file")
    return records[0], records[1:]


def _prepare_resume(paths: dict[str, Path], header: dict) -> dict[tuple[int, int], dict]:
    """Done chunks by key; checks settings and truncates outputs to the last recorded sizes."""
    recorded, chunks = _read_progress(paths["progress"])
    if recorded is None:
        for name in ("kept", "rejected"):
            if paths[name].exists() and paths[name].stat().st_size:
                raise AnnotateError(
                    f"{paths[name]} exists but {paths['progress']} does not; remove it or choose another --out"
                )
        _append(paths["progress"], json.dumps(header) + "\n")
        for name in ("kept", "rejected"):
            paths[name].write_text("")
        return {}
    if recorded != header:
        different = sorted(key for key in set(recorded["settings"]) | set(header["settings"])
                           if recorded["settings"].get(key) != header["settings"].get(key))
        if recorded.get("prompts") != header["prompts"]:
            different.append("prompts")
        raise AnnotateError(
            f"{paths['progress']} was written with other settings (differing: {different}); "
            f"rerun with the same settings to resume, or choose another --out"
        )
    # Rewrite the progress file without a partial last line, then cut outputs back to the last chunk.
    paths["progress"].write_text("".join(json.dumps(r) + "\n" for r in [recorded, *chunks]), encoding="utf-8")
    sizes = chunks[-1]["sizes"] if chunks else {"kept": 0, "rejected": 0}
    for name in ("kept", "rejected"):
        if not paths[name].exists():
            raise AnnotateError(f"{paths[name]} is missing but {paths['progress']} records finished chunks")
        if paths[name].stat().st_size < sizes[name]:
            raise AnnotateError(
                f"{paths[name]} is shorter than {paths['progress']} records; it was changed outside annotate"
            )
        with open(paths[name], "r+b") as handle:
            handle.truncate(sizes[name])
    if chunks:
        logger.info("resuming: %d chunks already done", len(chunks))
    return {(c["generator_index"], c["start"]): c for c in chunks}


# ---------------------------------------------------------------------------------- engines
def check_model_paths(paths: list[str]) -> None:
    """Fail before any work if a model path cannot even give a config (missing folder, not a model)."""
    from transformers import AutoConfig

    for path in paths:
        try:
            AutoConfig.from_pretrained(path)
        except Exception as exc:  # noqa: BLE001 -- re-raised with the path; any failure here means "cannot load"
            raise AnnotateError(f"model {path!r} does not load: {type(exc).__name__}: {exc}") from exc


VLLM_DEFAULT_MEMORY_SHARE = 0.9  # vLLM's own default gpu_memory_utilization


def engine_options_by_role(config: AnnotateConfig) -> dict[str, dict]:
    """`make_engine` keywords of the judge and of a generator.

    The judge stays loaded while each generator runs beside it. Two vLLM engines on one GPU at vLLM's default
    share (0.9 each) cannot both start: vLLM refuses the second when less memory is free than its share asks for.
    So when a generator other than the judge exists, the vLLM budget (`gpu_memory_utilization`, default 0.9) is
    split in halves; the shares of engines alive at once add up to the budget.
    """
    options = dict(config.engine_options)
    separate_generator = any(path != config.judge for path in config.generators)
    if config.engine != "vllm" or not separate_generator:
        return {"judge": options, "generator": options}
    budget = float(options.get("gpu_memory_utilization", VLLM_DEFAULT_MEMORY_SHARE))
    half = {**options, "gpu_memory_utilization": budget / 2}
    return {"judge": half, "generator": half}


def _load_engine(make_engine, config: AnnotateConfig, path: str, role: str) -> GenerationEngine:
    started = time.perf_counter()
    try:
        engine = make_engine(config.engine, path, **engine_options_by_role(config)[role])
    except Exception as exc:  # noqa: BLE001 -- re-raised naming the model and its role
        raise AnnotateError(
            f"{role} model {path!r} does not load ({config.engine} engine): {type(exc).__name__}: {exc}"
        ) from exc
    logger.info("loaded %s %s (%s engine) in %.1f s", role, path, config.engine, time.perf_counter() - started)
    return engine


def _uses_chat(engine: GenerationEngine) -> bool:
    tokenizer = getattr(engine, "tokenizer", None)
    return bool(getattr(tokenizer, "chat_template", None))


def _free_memory() -> None:
    """Collect a dropped engine now (its model may be large), and hand cached GPU memory back."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------- main
def _label_one_chunk(engine, judge: LLMJudge, pool, problems: list[MathProblem], chunk: Chunk, config: AnnotateConfig):
    """Generate k completions per question of `chunk`, verify and judge the non-empty ones, label them."""
    k = config.samples_per_question
    sampling = SamplingConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                              top_p=config.top_p, n=k, seed=chunk_seed(config.seed, chunk))
    chat = _uses_chat(engine)
    completions = engine.generate([generator_prompt(p.question, chat) for p in problems], sampling)
    if len(completions) != len(problems) * k:
        raise RuntimeError(f"generator returned {len(completions)} completions for {len(problems)} questions x {k}")
    triples = [(problems[i // k], text) for i, text in enumerate(completions) if text.strip()]
    questions, references, texts = [p.question for p, _ in triples], [p.reference for p, _ in triples], [t for _, t in triples]
    rule = pool.verify_batch(references, texts).outcomes if triples else []
    judgements = judge.judge(questions, references, texts) if triples else []
    return label_chunk(problems, completions, k, rule, judgements, config.generators[chunk.generator_index])


def _record_chunk(paths: dict[str, Path], chunk: Chunk, kept: list[dict], rejected: list[dict], counts: Counter) -> dict:
    """Append the chunk's rows (fsynced), then its progress line with both files' sizes (fsynced)."""
    sizes = {name: _append(paths[name], "".join(json.dumps(row) + "\n" for row in rows))
             for name, rows in (("kept", kept), ("rejected", rejected))}
    record = {"kind": "chunk", "generator_index": chunk.generator_index, "start": chunk.start, "end": chunk.end,
              "sizes": sizes, "counts": dict(counts)}
    _append(paths["progress"], json.dumps(record) + "\n")
    return record


def annotate(problems: list[MathProblem], config: AnnotateConfig, out: str | Path, *, verifier_workers: int = 1) -> dict:
    """Annotate `problems` into `out` (resuming if its progress file exists); returns the summary."""
    from cooper_openrlhf.engines import make_engine
    from cooper_openrlhf.verify.pool import VerifierPool

    paths = output_paths(out)
    paths["kept"].parent.mkdir(parents=True, exist_ok=True)
    header = {"kind": "header", "settings": json.loads(json.dumps(asdict(config))),
              "prompts": {"count": len(problems), "sha256": prompts_fingerprint(problems)}}
    check_model_paths([config.judge, *config.generators])
    done = _prepare_resume(paths, header)
    chunks = plan_chunks(len(problems), config)
    todo = [chunk for chunk in chunks if chunk.key() not in done]

    if todo:
        judge_engine = _load_engine(make_engine, config, config.judge, "judge")
        judge = LLMJudge(judge_engine, SamplingConfig(max_new_tokens=config.judge_max_new_tokens))
        started = time.perf_counter()
        with VerifierPool(num_workers=verifier_workers, deadline_s=config.verifier_timeout_s) as pool:
            generator_index, engine = None, None
            for finished, chunk in enumerate(todo, start=1):
                if chunk.generator_index != generator_index:
                    engine = None  # one generator in memory at a time
                    _free_memory()
                    generator_index = chunk.generator_index
                    path = config.generators[generator_index]
                    engine = judge_engine if path == config.judge else _load_engine(make_engine, config, path, "generator")
                kept, rejected, counts = _label_one_chunk(engine, judge, pool, problems[chunk.start : chunk.end], chunk, config)
                done[chunk.key()] = _record_chunk(paths, chunk, kept, rejected, counts)
                elapsed = time.perf_counter() - started
                logger.info(
                    "chunk %d/%d (generator %d/%d, questions %d-%d): kept %d of %d, empty %d; %.0f s elapsed, ~%.0f s left",
                    len(done), len(chunks), chunk.generator_index + 1, len(config.generators), chunk.start, chunk.end,
                    counts["kept"], counts["generated"], counts["empty"], elapsed, elapsed / finished * (len(todo) - finished),
                )
        engine = judge_engine = judge = None
        _free_memory()

    per_generator: dict[str, Counter] = {}
    for chunk in chunks:
        name = config.generators[chunk.generator_index]
        per_generator.setdefault(name, Counter({key: 0 for key in COUNT_KEYS})).update(done[chunk.key()]["counts"])
    summary = summarize(per_generator)
    if summary["total"]["empty"]:
        logger.warning("%d of %d completions were empty and were dropped", summary["total"]["empty"], summary["total"]["generated"])
    tmp = paths["summary"].with_name(paths["summary"].name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    tmp.replace(paths["summary"])
    return summary
