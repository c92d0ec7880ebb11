"""Measure a verifier against labelled data: accuracy, precision, recall, F1 and the confusion matrix.

    cooper inspect eval-verifier --data FILE --verifier rule   # = python -m cooper_openrlhf.cli.eval_verifier

Reads VerifyBench-format JSON Lines (`question`, `answer`, `completion`, `gold_correct`, optional
`answer_type`), asks the chosen verifier whether each completion is correct, and reports
accuracy, precision, recall, F1 and the confusion matrix (positive = "correct"), overall and per
`answer_type`: a table on stdout, and with `--json-out` the same numbers as JSON. The verifiers are
run and scored by `rm/compare.py`, as in `verifyrm compare`.

Verifiers:
  rule   math-verify in a process pool with a hard per-item deadline (`--workers`, `--timeout`);
         NO_ANSWER, TIMEOUT and ERROR count as predicted-incorrect.
  rm     a reward-model checkpoint (`--model`): correct when sigmoid(logit) >= `--threshold`; also how it ranks
         completions whatever the threshold (`ranking`: ROC-AUC over all rows and within each question, and the
         mean reward of correct and of wrong completions).
  judge  an LLM judge (`--model`, `--engine hf|vllm`); UNDECIDED counts as predicted-incorrect.
"""

import argparse
import json
import logging
import sys
import time
from collections import Counter

from cooper_openrlhf.data.benchmarks import BenchmarkFormatError, load_benchmark
from cooper_openrlhf.data.records import VerifyExample
from cooper_openrlhf.engines import ENGINE_KINDS
from cooper_openrlhf.rm import compare as cmp
from cooper_openrlhf.verify.metrics import ranking_metrics, verdict_is_positive

NO_ANSWER_TYPE = "(none)"  # group of rows without an answer_type


def predict_rule(examples: list[VerifyExample], args: argparse.Namespace) -> tuple[list[bool], dict]:
    verdicts = cmp.rule_verdicts(examples, args.workers, args.timeout)
    counts = Counter(verdict.value for verdict in verdicts)
    return [verdict_is_positive(v) for v in verdicts], {"verdict_counts": dict(sorted(counts.items()))}


def predict_rm(examples: list[VerifyExample], args: argparse.Namespace) -> tuple[list[bool], dict]:
    from cooper_openrlhf.rm.model import check_reward_model, recorded_template_version

    scores = cmp.rm_scores(examples, args.model, args.batch_size, args.max_length, args.device)
    ranking = ranking_metrics(scores, [e.gold_correct for e in examples], [e.question for e in examples])
    show = lambda value: None if value is None else round(value, 4)  # noqa: E731
    return [score >= args.threshold for score in scores], {
        "threshold": args.threshold, "template": recorded_template_version(check_reward_model(args.model)),
        # How it orders completions, whatever the threshold, over all rows and within each question (verify/metrics.py).
        "ranking": {key: value if isinstance(value, int) else show(value) for key, value in ranking.to_dict().items()},
    }


def predict_judge(examples: list[VerifyExample], args: argparse.Namespace) -> tuple[list[bool], dict]:
    from cooper_openrlhf.verify.judge import JudgeVerdict

    engine_options = {"device": args.device, "batch_size": args.batch_size} if args.engine == "hf" else {}
    verdicts = cmp.judge_verdicts(examples, args.model, args.engine, args.max_new_tokens, engine_options)
    counts = Counter(verdict.value for verdict in verdicts)
    return [v == JudgeVerdict.YES for v in verdicts], {"verdict_counts": dict(sorted(counts.items()))}


VERIFIERS = {"rule": predict_rule, "rm": predict_rm, "judge": predict_judge}


PROG = "cooper inspect eval-verifier"  # `python -m cooper_openrlhf.cli.eval_verifier` runs the same command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="VerifyBench-format JSON Lines file")
    parser.add_argument("--verifier", required=True, choices=sorted(VERIFIERS))
    parser.add_argument("--json-out", help="also write the report as JSON to this file")
    parser.add_argument("--skip-invalid", action="store_true", help="skip (and count) unreadable rows instead of failing")
    parser.add_argument("--limit", type=int, help="evaluate only the first N readable rows")
    parser.add_argument("--workers", type=int, default=None, help="rule: worker processes (default: CPU count)")
    parser.add_argument("--timeout", type=float, default=5.0, help="rule: hard deadline per item, seconds")
    parser.add_argument("--model", help="rm / judge: model folder")
    parser.add_argument("--threshold", type=float, default=0.5, help="rm: predicted correct when sigmoid(logit) >= this")
    parser.add_argument("--max-length", type=int, help="rm: tokens per input (default: what the export records)")
    parser.add_argument("--batch-size", type=int, default=8, help="rm / judge (hf): inputs per forward pass")
    parser.add_argument("--device", default="cpu", help="rm / judge (hf): torch device")
    parser.add_argument("--engine", default="hf", choices=ENGINE_KINDS, help="judge: generation engine")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="judge: reply length in tokens")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.verifier in ("rm", "judge") and not args.model:
        raise SystemExit(f"--verifier {args.verifier} needs --model")
    try:
        loaded = load_benchmark("verifybench", args.data, skip_invalid=args.skip_invalid)
    except BenchmarkFormatError as exc:
        raise SystemExit(f"error: {exc} (--skip-invalid skips and counts such rows)") from exc
    examples = loaded.records[: args.limit] if args.limit is not None else loaded.records
    if not examples:
        raise SystemExit(f"no readable rows in {args.data}")
    start = time.perf_counter()
    predicted, details = VERIFIERS[args.verifier](examples, args)
    seconds = time.perf_counter() - start
    gold = [e.gold_correct for e in examples]
    types = [e.answer_type or NO_ANSWER_TYPE for e in examples]
    result = cmp.compare(examples, gold, {args.verifier: predicted}, "gold_correct", groups=types)

    print(f"verifier={args.verifier} data={args.data} rows={len(examples)} skipped={len(loaded.skipped)} seconds={seconds:.2f}")
    for key, value in details.items():
        print(f"{key}: {value}")
    print(cmp.format_comparison(result))
    if args.json_out:
        report = {
            "verifier": args.verifier,
            "data": args.data,
            "n": len(examples),
            "skipped": [{"line": line, "reason": reason} for line, reason in loaded.skipped],
            "seconds": seconds,
            "details": details,
            "overall": result.overall[args.verifier].to_dict(),
            "by_answer_type": {name: m.to_dict() for name, m in result.by_group[args.verifier].items()},
        }
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
