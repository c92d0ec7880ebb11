"""How long one CPU vLLM engine takes to start, with its worker in the engine-core process or in a process of its own.

OpenRLHF starts each engine as an AsyncLLM in a Ray actor: the actor imports vLLM, the engine core runs in a
process of its own, and on CPU vLLM turns the "uni" executor OpenRLHF asks for into "mp" (one more process, a
worker) unless VLLM_ENABLE_V1_MULTIPROCESSING=0 (vllm/platforms/cpu.py). Each process re-imports torch and vLLM.
The CPU runtime (runtime/ray_env.py) sets the variable to 0; this measures what that saves, in one run: per round
one engine each way (order alternating), timed from `create_vllm_engines` to the first generated tokens, in a
fresh Ray cluster per engine so no warm worker is reused.

    python benchmarks/vllm_cpu_engine_start.py [--rounds 2] [--model tiny-qwen2-policy]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WAYS = {"worker in its own process (vLLM's CPU default)": "1", "worker in the engine core (CPU runtime)": "0"}


def start_and_generate(model: str, multiprocessing: str) -> float:
    import ray
    from openrlhf.trainer.ray.vllm_engine import create_vllm_engines
    from vllm import SamplingParams

    from cooper_openrlhf.runtime.ray_cluster import init_local_ray

    init_local_ray(log_to_driver=False, runtime_env={"env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing}})
    try:
        start = time.perf_counter()
        (engine,) = create_vllm_engines(1, 1, model, seed=0, full_determinism=False, enable_prefix_caching=False,
                                        enforce_eager=True, max_model_len=256, gpu_memory_utilization=0.9)
        output = ray.get(engine.generate.remote([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4)))
        assert len(output.outputs[0].token_ids) == 4
        return time.perf_counter() - start
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="tiny-qwen2-policy", help="a model name of cooper_openrlhf.models")
    args = parser.parse_args()
    from cooper_openrlhf.models import model_path

    model = str(model_path(args.model))
    times: dict[str, list[float]] = {name: [] for name in WAYS}
    for round_index in range(args.rounds):
        order = list(WAYS) if round_index % 2 == 0 else list(reversed(WAYS))
        for name in order:
            times[name].append(start_and_generate(model, WAYS[name]))
            print(f"round {round_index + 1}: {name}: {times[name][-1]:.1f} s", flush=True)
    baseline, runtime = (statistics.median(times[name]) for name in WAYS)
    for name in WAYS:
        print(f"{name:50s} median {statistics.median(times[name]):6.1f} s over {args.rounds}")
    print(f"start-up, vLLM's CPU default / the CPU runtime's: {baseline / runtime:.2f}x")


if __name__ == "__main__":
    main()
