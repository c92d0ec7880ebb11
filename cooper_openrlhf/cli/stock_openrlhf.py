"""`python -m cooper_openrlhf.cli.stock_openrlhf ARGS...`: stock `python -m openrlhf.cli.train_ppo_ray ARGS...`,
unchanged, on a machine without CUDA.

Nothing of OpenRLHF is patched or extended: this only starts the local Ray cluster with the package's CPU runtime
in every worker (`runtime.ray_cluster.init_local_ray`: the shims of `runtime/cpu.py`, logical over-commit of CPUs
and GPUs), then runs OpenRLHF's own module as `__main__`. Where CUDA exists it is a plain `ray.init` and the same
run. It is how the reward service (`cli.serve`) is tested with the real OpenRLHF client on CPU, and how a user
without a GPU tries `--reward.remote_url` end to end (docs/serve.md).
"""

import runpy
import sys


def main(argv: list[str]) -> None:
    from cooper_openrlhf.runtime.ray_cluster import init_local_ray

    init_local_ray()
    sys.argv = ["openrlhf.cli.train_ppo_ray", *argv]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
