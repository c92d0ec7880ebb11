"""Run stock OpenRLHF's `train_ppo_ray`, unchanged, on a machine without CUDA.

    cooper stock-openrlhf ARGS...   # = python -m cooper_openrlhf.cli.stock_openrlhf ARGS...
                                    # = stock python -m openrlhf.cli.train_ppo_ray ARGS..., CPU runtime

Nothing of OpenRLHF is patched or extended: this only starts the local Ray cluster with the package's CPU runtime
in every worker (`runtime.ray_cluster.init_local_ray`: the shims of `runtime/cpu.py`, logical over-commit of CPUs
and GPUs), then runs OpenRLHF's own module as `__main__`. Where CUDA exists it is a plain `ray.init` and the same
run. It is how the reward service (`cli.serve`) is tested with the real OpenRLHF client on CPU, and how a user
without a GPU tries `--reward.remote_url` end to end (docs/serve.md).
"""

import runpy
import sys

PARAM_DTYPE_FLAG = "--ds.param_dtype"
STOCK_PARAM_DTYPE = "bf16"  # openrlhf/cli/train_ppo_ray.py's default


def trainer_dtype(argv: list[str]) -> str:
    """The dtype stock OpenRLHF trains in for these arguments (its `--ds.param_dtype`, last one wins)."""
    dtype = STOCK_PARAM_DTYPE
    for i, arg in enumerate(argv):
        if arg == PARAM_DTYPE_FLAG and i + 1 < len(argv):
            dtype = argv[i + 1]
        elif arg.startswith(PARAM_DTYPE_FLAG + "="):
            dtype = arg.split("=", 1)[1]
    return dtype


def main(argv: list[str]) -> None:
    from cooper_openrlhf.runtime.dtype import DTYPES, announce_run_dtype
    from cooper_openrlhf.runtime.ray_cluster import init_local_ray

    # The engines are created in the announced dtype (runtime/cpu.py). Announce the one stock OpenRLHF trains in,
    # over any inherited from a parent process (a cooper run's start-up announces fp32 on a CPU without bf16 units),
    # so both ends of the weight sync agree.
    dtype = trainer_dtype(argv)
    if dtype in DTYPES:
        announce_run_dtype(dtype)
    if "-h" in argv or "--help" in argv:  # stock's parser prints the flags and exits: the CPU shims, no Ray
        from cooper_openrlhf.runtime import install_cpu_runtime

        print(f"{__doc__.splitlines()[0]}\nEvery flag is stock OpenRLHF's:\n", flush=True)
        install_cpu_runtime()
    else:
        init_local_ray()
    sys.argv = ["openrlhf.cli.train_ppo_ray", *argv]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
