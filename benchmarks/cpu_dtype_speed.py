"""bf16 next to fp32 on this CPU, for the three kinds of work a CPU Cooper run does, in one run.

  policy step   SmolLM2-135M-Instruct forward + backward + AdamW step over --batch x --tokens tokens (plain torch)
  RM step       the MiniLM VerifyRM (one-logit head) forward + backward + AdamW step, BCE, --rm-batch x 128 tokens
  vLLM batch    SmolLM2-135M-Instruct on the CPU build of vLLM: --prompts prompts, --new-tokens greedy tokens each

Each line: median seconds of --repeats timed runs (after one untimed warm-up) per dtype, and fp32 / bf16.
The header names the CPU (lscpu's model name), whether it has bf16 units (AVX-512 BF16 / AMX / Arm BF16, read
from /proc/cpuinfo by runtime/dtype.py) and what `--ds.param_dtype auto` picks here. Where bf16 is emulated
(no bf16 units) expect bf16 to be tens of times slower; where it is native, compare the two columns.

    python benchmarks/cpu_dtype_speed.py [--repeats 3] [--batch 2] [--tokens 200] [--skip-vllm]
"""

import argparse
import gc
import os
import statistics
import subprocess
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from cooper_openrlhf.models import model_path  # noqa: E402
from cooper_openrlhf.runtime.dtype import DTYPES, cpu_has_bf16_units, resolve_dtype_name  # noqa: E402

DTYPE_NAMES = ("bf16", "fp32")


def cpu_model_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (lscpu failed)"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def timed(step, repeats: int) -> float:
    """Median seconds of `repeats` calls of `step` after one untimed warm-up call."""
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def policy_step(dtype: torch.dtype, batch: int, tokens: int, repeats: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path("smollm2-135m-instruct"), dtype=dtype,
                                                 attn_implementation="eager")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(100, model.config.vocab_size - 100, (batch, tokens), generator=torch.Generator().manual_seed(0))

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = timed(step, repeats)
    del model, optimizer
    gc.collect()
    return seconds


def rm_step(dtype: torch.dtype, batch: int, repeats: int) -> float:
    import torch.nn.functional as F

    from cooper_openrlhf.rm.model import load_rm

    model, tokenizer, _ = load_rm(model_path("minilm-l6-v2"), dtype=dtype, attn_implementation="eager", init_head=True)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    texts = [f"Question: what is {i} + {i}? Reference: {2 * i}. Completion: " + "we add the numbers. " * 20
             for i in range(batch)]
    encoded = tokenizer(texts, return_tensors="pt", padding="max_length", truncation=True, max_length=128)
    labels = torch.tensor([float(i % 2) for i in range(batch)])

    def step():
        logits = model(**encoded).logits.squeeze(-1).float()
        F.binary_cross_entropy_with_logits(logits, labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = timed(step, repeats)
    del model, optimizer
    gc.collect()
    return seconds


def vllm_batch(dtype_name: str, prompts: int, new_tokens: int, repeats: int) -> float:
    from cooper_openrlhf.engines.base import SamplingConfig
    from cooper_openrlhf.engines.vllm_offline import VLLMEngine

    engine = VLLMEngine(model_path("smollm2-135m-instruct"), dtype=dtype_name, max_model_len=512, enforce_eager=True)
    questions = [f"What is {i} + {2 * i}? Explain step by step." for i in range(prompts)]
    # ignore_eos is not in SamplingConfig: greedy answers stop at different lengths, the same in both dtypes or
    # nearly; the per-token figure below removes most of that.
    sampling = SamplingConfig(n=1, temperature=0.0, max_new_tokens=new_tokens)
    seconds = timed(lambda: engine.generate(questions, sampling), repeats)
    del engine
    gc.collect()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (after one warm-up)")
    parser.add_argument("--batch", type=int, default=2, help="policy step: sequences")
    parser.add_argument("--tokens", type=int, default=200, help="policy step: tokens per sequence")
    parser.add_argument("--rm-batch", type=int, default=8, help="RM step: sequences of 128 tokens")
    parser.add_argument("--prompts", type=int, default=8, help="vLLM batch: prompts")
    parser.add_argument("--new-tokens", type=int, default=64, help="vLLM batch: max new tokens per prompt")
    parser.add_argument("--skip-vllm", action="store_true", help="leave the vLLM batch out")
    args = parser.parse_args()

    from cooper_openrlhf.runtime import install_cpu_runtime

    install_cpu_runtime()  # vLLM's CPU shims (seeded sampling) in its processes; a no-op with CUDA
    auto = resolve_dtype_name("auto")
    print(f"CPU: {cpu_model_name()}; bf16 units: {'yes' if cpu_has_bf16_units() else 'no'}; "
          f"--ds.param_dtype auto -> {auto}; torch threads: {torch.get_num_threads()}", flush=True)

    rows = []
    work = [
        (f"policy step (SmolLM2-135M, {args.batch}x{args.tokens} tok)",
         lambda name: policy_step(DTYPES[name], args.batch, args.tokens, args.repeats)),
        (f"RM step (MiniLM, {args.rm_batch}x128 tok)", lambda name: rm_step(DTYPES[name], args.rm_batch, args.repeats)),
    ]
    if not args.skip_vllm:
        work.append((f"vLLM batch (SmolLM2, {args.prompts} prompts x {args.new_tokens} tok)",
                     lambda name: vllm_batch(name, args.prompts, args.new_tokens, args.repeats)))
    for label, measure in work:
        seconds = {}
        for name in DTYPE_NAMES:
            seconds[name] = measure(name)
            print(f"  {label}: {name} {seconds[name]:.3f} s", flush=True)
        rows.append((label, seconds))

    print(f"\nmedian seconds of {args.repeats} runs (auto = {auto})")
    print(f"{'work':<48} {'bf16':>9} {'fp32':>9} {'fp32/bf16':>10} {'auto vs other':>14}")
    for label, seconds in rows:
        other = "fp32" if auto == "bf16" else "bf16"
        speedup = seconds[other] / seconds[auto]
        print(f"{label:<48} {seconds['bf16']:9.3f} {seconds['fp32']:9.3f} {seconds['fp32'] / seconds['bf16']:10.2f} "
              f"{speedup:13.2f}x")


if __name__ == "__main__":
    main()
