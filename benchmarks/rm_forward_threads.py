"""The RM's bare forward on one OpenMP thread against all of them, by batch size, under the reward service's policy,
and the service's scorer, which picks between the two per batch size (`runtime/cpu_threads.py`).

    python benchmarks/rm_forward_threads.py            # the tiny Qwen2 RM and the lab's MiniLM VerifyRM

`cli.serve` sets OMP_WAIT_POLICY=PASSIVE before torch loads, so each parallel region wakes sleeping threads; for a
small model or a small batch that wake-up costs more than the second thread saves. This prints samples/s of
`rm.model.score_logits` over the same arithmetic samples at batch 1, 4, 8, 16, 32 and 64, with
`torch.set_num_threads(1)` and with all threads, then of `rm.scorer.RMScorer` (its choice made on the first
batches of each size, as in the service), and the scorer's rate against the better fixed count at each batch, in one
process per RM (the wait policy is read when torch loads). docs/serve.md ("One OpenMP thread or all") reads it.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

BATCHES = (1, 4, 8, 16, 32, 64)


def rates(rm: str, count: int = 256) -> dict[int, dict[int, float]]:
    """{threads: {batch: samples/s}} of the bare forward, in this process."""
    import torch

    from cooper_openrlhf.rm.model import load_rm, score_logits, usable_max_length
    from cooper_openrlhf.rm.scorer import RMScorer
    from cooper_openrlhf.runtime.dtype import resolve_dtype_name, torch_dtype

    model, tokenizer, version = load_rm(rm, dtype=torch_dtype(resolve_dtype_name("auto")))
    max_length = usable_max_length(model)
    questions = [f"What is {i} + 7?" for i in range(count)]
    references = [str(i + 7) for i in range(count)]
    completions = [f"First, {i} + 7 = {i + 7}. The answer is {i + 7}." for i in range(count)]

    def forward(s, batch):
        score_logits(model, tokenizer, questions[s:s + batch], references[s:s + batch], completions[s:s + batch],
                     max_length=max_length, template_version=version, batch_size=batch)

    scorer = RMScorer(model, tokenizer, max_length=max_length, template_version=version, batch_size=max(BATCHES))

    def chosen(s, batch):
        scorer.logits_of([(0, questions[i], references[i], completions[i]) for i in range(s, s + batch)])

    out, most = {}, torch.get_num_threads()
    for threads in [*sorted({1, most}), "chosen"]:
        torch.set_num_threads(most if threads == "chosen" else threads)
        out[threads] = {}
        for batch in BATCHES:
            call = chosen if threads == "chosen" else forward
            for s in range(0, 8 * batch, batch):  # warm-up; the scorer's trials of each count
                call(s % count, batch)
            start = time.perf_counter()
            for s in range(0, count, batch):
                call(s, batch)
            out[threads][batch] = count / (time.perf_counter() - start)
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(rates(sys.argv[2])))
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from serve_throughput import minilm_verifyrm

    from cooper_openrlhf.models import model_path

    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as work:
        for name, rm in (("tiny Qwen2 RM", model_path("tiny-qwen2-rm")), ("MiniLM VerifyRM", minilm_verifyrm(work))):
            run = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", rm], env=env,
                                 capture_output=True, text=True, check=True)
            table = json.loads(run.stdout.strip().splitlines()[-1])
            for threads, by_batch in table.items():
                label = "the scorer's choice" if threads == "chosen" else f"{threads} thread(s)"
                print(f"{name}, {label}, OpenMP passive: "
                      + ", ".join(f"batch {b}: {r:.0f}/s" for b, r in by_batch.items()), flush=True)
            best = {b: max(table[t][b] for t in table if t != "chosen") for b in table["chosen"]}
            print(f"{name}, the scorer's choice / the better fixed count: "
                  + ", ".join(f"batch {b}: {table['chosen'][b] / best[b]:.2f}x" for b in best), flush=True)


if __name__ == "__main__":
    main()
