"""Benchmark evaluation: prompts -> engines/ -> verify/ -> pure aggregation (avg@k, pass@k, bootstrap SE).

`prompts.build_messages` and `metrics.summarize` / `metrics.average_over_benchmarks` are also what
the trainer calls for held-out evaluation on its own vLLM engines; `runner.grade` grades with the
rule verifier pool.
"""
