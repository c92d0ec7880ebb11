"""Questions per second of `evaluate`'s pipeline against a bare vLLM `generate` on the same prompts, in one run.

    python benchmarks/eval_throughput.py --data-dir ../shared/data [--questions 32 --samples 4 --max-new-tokens 256]

One vLLM engine is built (as `cli.evaluate` builds it) and warmed up; then, `--repeats` times and
alternating, (a) one bare `LLM.generate` call on the chat-rendered prompts (the floor: pure
generation) and (b) `eval.runner.evaluate_benchmark` on the same questions, with the same seeds
and sampling, from an empty generation cache: prompt building, generation in batches of
`--batch-questions`, cache appends with fsync, grading with the rule verifier pool, and the
summary. The verifier pool is started once beforehand (as the CLI does, once per run). Prints
questions/s of both, their ratio, and evaluate's split into generation and grading time.
Run it under the heavy lock: `flock /tmp/cooper-heavy.lock python benchmarks/eval_throughput.py ...`.
"""

import argparse
import logging
import tempfile
import time
from pathlib import Path

from cooper_openrlhf.cli.evaluate import build_parser as build_evaluate_parser
from cooper_openrlhf.cli.evaluate import make_engine_for
from cooper_openrlhf.engines.base import SamplingConfig, prompt_token_ids
from cooper_openrlhf.eval.cache import GenerationCache
from cooper_openrlhf.eval.datasets import load_problems, parse_benchmark_specs
from cooper_openrlhf.eval.prompts import build_messages
from cooper_openrlhf.eval.runner import evaluate_benchmark, get_protocol
from cooper_openrlhf.models import model_path
from cooper_openrlhf.runtime.dtype import resolve_dtype_name
from cooper_openrlhf.verify.pool import VerifierPool


def bare_generate(engine, problems, sampling: SamplingConfig) -> float:
    """Seconds for one vLLM generate call over all prompts (rendering outside the clock)."""
    from vllm import SamplingParams

    params = SamplingParams(n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
                            max_tokens=sampling.max_new_tokens, seed=sampling.seed)
    requests = [{"prompt_token_ids": prompt_token_ids(engine.tokenizer, build_messages(p.question))} for p in problems]
    start = time.perf_counter()
    engine.llm.generate(requests, params, use_tqdm=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the materialised SmolLM2-135M-Instruct")
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--benchmark", default="gsm8k")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-questions", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--verifier-workers", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    model = args.model or str(model_path("smollm2-135m-instruct"))
    engine_args = build_evaluate_parser().parse_args(["--model", model, "--out", "unused", "--engine", "vllm"])
    (spec,) = parse_benchmark_specs(args.benchmark, args.data_dir)
    problems = load_problems(spec, args.questions)
    protocol = get_protocol("paper")
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=protocol.temperature,
                              top_p=protocol.top_p, n=args.samples, seed=0)
    engine = make_engine_for(engine_args, resolve_dtype_name("auto"))
    engine.generate([build_messages(problems[0].question)], SamplingConfig(max_new_tokens=8))  # warm-up

    bare_s, eval_s, split = [], [], []
    with VerifierPool(num_workers=args.verifier_workers) as pool, tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            bare_s.append(bare_generate(engine, problems, sampling))
            with GenerationCache(Path(tmp) / f"run{repeat}.jsonl", {"repeat": repeat}) as cache:
                start = time.perf_counter()
                result = evaluate_benchmark(spec.name, problems, engine, sampling, cache, pool,
                                            batch_questions=args.batch_questions)
                eval_s.append(time.perf_counter() - start)
            split.append(result.seconds)
            print(f"repeat {repeat}: bare generate {bare_s[-1]:.2f} s, evaluate {eval_s[-1]:.2f} s "
                  f"(generate {result.seconds['generate']:.2f} s, grade {result.seconds['grade']:.2f} s)", flush=True)

    n = len(problems)
    bare_qps, eval_qps = n / min(bare_s), n / min(eval_s)
    print(f"\n{n} {spec.name} questions x {args.samples} samples, max {args.max_new_tokens} new tokens, "
          f"best of {args.repeats}")
    print(f"bare vLLM generate: {bare_qps:.2f} questions/s")
    print(f"evaluate pipeline:  {eval_qps:.2f} questions/s")
    print(f"ratio evaluate / bare: {eval_qps / bare_qps:.3f}  "
          f"(grading {min(s['grade'] for s in split):.2f} s of {min(eval_s):.2f} s)")


if __name__ == "__main__":
    main()
