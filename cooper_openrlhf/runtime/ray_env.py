"""The Ray runtime environment of a Cooper run, owned in one place.

Two parties set it: the launcher, which submits the job (`ray job submit --runtime-env-json`, from the plan in
`cluster/rl_plan.py`), and the driver, whose `ray.init(runtime_env=...)` (`cli/train_cooper.start_ray`)
runs inside that job. Ray merges the two and refuses any field or environment variable both name, even with the
same value ("Failed to merge the Job's runtime env ... because of a conflict", ray/_private/worker.py). So both
build their env with `cooper_runtime_env`, and the driver passes only what the submitted job does not already
set (`driver_runtime_env`).

On a cluster without CUDA the env also carries the CPU runtime (`runtime/cpu.py`): the worker set-up hook that
installs it in every Ray worker, and the variables it and vLLM's processes read.
"""

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping

from cooper_openrlhf.runtime import cpu
from cooper_openrlhf.runtime.dtype import RUN_DTYPE_ENV
from cooper_openrlhf.runtime.toolchain import worker_path_var

# Set by `ray job submit` in the entrypoint's environment: the job's config, runtime env included.
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
CPU_SETUP_HOOK = "cooper_openrlhf.runtime.cpu.install"

# Stock OpenRLHF's `ray.init` env (openrlhf/cli/train_ppo_ray.py), with the launcher's values where it set them.
_STOCK_DEFAULTS = {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
# Fixed on a CPU cluster: one thread per process (a node runs many worker processes on few cores), DeepSpeed's
# CPU accelerator, the flag vLLM's own processes read to install the CPU runtime (runtime/vllm_plugin.py), and
# each vLLM engine's worker inside its engine-core process: on CPU vLLM otherwise turns OpenRLHF's "uni" executor
# into "mp" (vllm/platforms/cpu.py), one more process per engine that re-imports torch and vLLM before the first
# rollout (benchmarks/vllm_cpu_engine_start.py measures the start-up both ways). The engine core keeps a process
# of its own, so vLLM's thread binding still pins that process, not the Ray actor.
_CPU_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "DS_ACCELERATOR": "cpu",
            cpu.CPU_RUNTIME_ENV: "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# Passed on to every worker when the driver's environment has them (models offline, model folder, KV cache, dtype).
_PASS_THROUGH = ("HF_HUB_OFFLINE", "COOPER_MODELS_DIR", "VLLM_CPU_KVCACHE_SPACE", "PYTHONPATH", RUN_DTYPE_ENV)


def cooper_runtime_env(environ: Mapping[str, str] | None = None, *, on_cpu: bool) -> dict:
    """The runtime env every Ray worker of a run gets: env vars (the environment's values over the defaults) and,
    on a CPU cluster, the set-up hook that installs the CPU runtime."""
    environ = os.environ if environ is None else environ
    env_vars = {key: environ.get(key, value) for key, value in _STOCK_DEFAULTS.items()}
    env_vars.update({key: environ[key] for key in _PASS_THROUGH if key in environ})
    env_vars.update(worker_path_var())  # one ninja for DeepSpeed's op builds (runtime/toolchain.py)
    if on_cpu:
        env_vars.update(_CPU_ENV)
    runtime_env: dict = {"env_vars": env_vars}
    if on_cpu:
        runtime_env["worker_process_setup_hook"] = CPU_SETUP_HOOK
    return runtime_env


def submitted_job_runtime_env(environ: Mapping[str, str] | None = None) -> dict | None:
    """The runtime env of the Ray job this process is the entrypoint of (`ray job submit`), or None."""
    environ = os.environ if environ is None else environ
    raw = environ.get(RAY_JOB_CONFIG_ENV)
    if not raw:
        return None
    return json.loads(raw).get("runtime_env") or {}


def without_job_fields(own: dict, job: dict | None) -> dict:
    """`own` less every field and env var `job` already sets (Ray refuses to merge duplicates)."""
    if job is None:
        return own
    taken = set(job.get("env_vars") or {})
    merged = {key: value for key, value in own.items() if key != "env_vars" and key not in job}
    env_vars = {key: value for key, value in (own.get("env_vars") or {}).items() if key not in taken}
    if env_vars:
        merged["env_vars"] = env_vars
    return merged


def driver_runtime_env(environ: Mapping[str, str] | None = None, *, on_cpu: bool) -> dict:
    """What the driver's `ray.init` passes: Cooper's runtime env, less what the submitted job already set."""
    environ = os.environ if environ is None else environ
    return without_job_fields(cooper_runtime_env(environ, on_cpu=on_cpu), submitted_job_runtime_env(environ))


class WorkersCannotImportError(RuntimeError):
    """The package is importable here only from the current folder; Ray's workers start elsewhere."""


def check_workers_can_import(module: str = "cooper_openrlhf", environ: Mapping[str, str] | None = None) -> None:
    """Fail before Ray starts when a process started outside the current folder cannot import `module`: Ray's
    workers start in their own folder, and every CPU worker runs the set-up hook from it, so a checkout used without
    `pip install -e .` would otherwise end in each actor's death with ModuleNotFoundError deep in Ray's logs."""
    environ = os.environ if environ is None else environ
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=tempfile.gettempdir(), env=dict(environ),
                           capture_output=True, text=True)
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise WorkersCannotImportError(
            f"Ray's workers could not import {module}: a Python started outside {os.getcwd()} cannot "
            f"({sys.executable} -c 'import {module}': {reason}). Install the package into this environment "
            f"(pip install -e <the checkout>) or put the checkout on PYTHONPATH.")
