"""Start a local Ray cluster that OpenRLHF's actors can be scheduled on, on any machine.

OpenRLHF asks Ray for one CPU and one GPU per model actor and a {"GPU": 1, "CPU": 1} bundle per vLLM
engine (trainer/ray/launcher.py:254-287, vllm_engine.py:270). On a small CPU machine those requests exceed
what exists and Ray waits forever without a word, so on CPU the cluster declares logical resources
(over-commit): they are scheduling tokens, not cores. Every worker process runs the CPU runtime first.
"""

import logging
import os

import ray

from cooper_openrlhf.runtime import cpu
from cooper_openrlhf.runtime.ray_env import cooper_runtime_env, submitted_job_runtime_env

logger = logging.getLogger(__name__)

# Logical resources declared on a CPU-only machine: enough for policy + reference + reward + critic
# actors and two vLLM engines at one "GPU" each.
CPU_LOGICAL_CPUS = 16
CPU_LOGICAL_GPUS = 8


def ray_cluster_address() -> str | None:
    """The Ray cluster a driver is told to join (RAY_ADDRESS, as `ray.init()` reads it), or None for a local one."""
    return os.environ.get("RAY_ADDRESS") or None


def run_on_gpus() -> bool:
    """Whether this run's models compute on GPUs. A driver joining a named cluster (RAY_ADDRESS) may sit on a
    CPU-only head node, so there its own CUDA says nothing: the run is on GPUs unless the job it was submitted as
    carries the CPU runtime (the launchers' CPU mode, GPUS_PER_NODE=0, puts it in the job's env). Without a named
    cluster the run is local: on GPUs when this process sees CUDA."""
    if cpu.cuda_available():
        return True
    if ray_cluster_address() is None:
        return False
    job_env = (submitted_job_runtime_env() or {}).get("env_vars") or {}
    return job_env.get(cpu.CPU_RUNTIME_ENV) != "1"


def init_local_ray(num_cpus: int | None = None, num_gpus: int | None = None, **ray_init_kwargs) -> None:
    """`ray.init` for a single machine; on CPU with logical over-commit and the CPU runtime in every worker.

    On a machine with CUDA this is a plain `ray.init` with the real resources (or the ones given).
    """
    if ray.is_initialized():
        return
    extra = dict(ray_init_kwargs.pop("runtime_env", None) or {})
    on_cpu = not cpu.cuda_available()
    runtime_env = cooper_runtime_env(on_cpu=on_cpu)  # the caller's fields and env vars over Cooper's
    runtime_env.update({key: value for key, value in extra.items() if key != "env_vars"})
    runtime_env["env_vars"].update(extra.get("env_vars") or {})
    if on_cpu:
        cpu.install()
        num_cpus = num_cpus if num_cpus is not None else CPU_LOGICAL_CPUS
        num_gpus = num_gpus if num_gpus is not None else CPU_LOGICAL_GPUS
    ray_init_kwargs.setdefault("include_dashboard", False)
    ray_init_kwargs.setdefault("log_to_driver", True)
    # A new cluster of this process's own: without an address, `ray.init()` joins any cluster `ray start` left
    # running on the machine (and then refuses num_cpus / num_gpus). Joining a named cluster is RAY_ADDRESS's job.
    ray_init_kwargs.setdefault("address", "local")
    ray.init(num_cpus=num_cpus, num_gpus=num_gpus, runtime_env=runtime_env, **ray_init_kwargs)
    logger.info("local Ray cluster: %s", ray.cluster_resources())


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def bundle_has_cuda(placement_group, bundle_index: int = 0) -> bool:
    """Whether CUDA is visible where a bundle of `placement_group` lands, asked there: a process that holds no
    GPU (a CPU-only actor, a head node) sees none whatever the cluster has. On the CPU runtime's logical GPUs: False."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    where = PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=bundle_index)
    # A sliver of the bundle's GPU: enough to be given the device, never enough to block what is placed there next.
    probe = ray.remote(num_cpus=0, num_gpus=0.01)(_cuda_visible)
    return ray.get(probe.options(scheduling_strategy=where).remote())
