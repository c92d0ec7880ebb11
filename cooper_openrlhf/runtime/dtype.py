"""The dtype a run computes in: OpenRLHF's bf16 on GPU, the CPU's fast dtype on CPU.

On a CPU without bf16 units (no AVX-512 BF16, no AMX) a bf16 or fp16 matmul is emulated: a
1024x384x1536 matmul on one thread took 902 ms in bf16 and 19 ms in fp32 (47x) on an AVX2-only
AMD EPYC, and one SmolLM2-135M forward+backward over 2 x 200 tokens 94.4 s in bf16 and 3.6 s in
fp32. Where the units exist (AMX, AVX-512 BF16) bf16 is the fast one. `fast_dtype_name()` decides
once per process from the CPU flags; `resolve_dtype_name("auto")` is what every stage asks for.

Names are OpenRLHF's `--ds.param_dtype` values, plus "fp32" and "auto":
  auto  GPU: bf16 (OpenRLHF's default); CPU: bf16 with bf16 units, else fp32
  bf16  everywhere
  fp16  GPU only (on CPU it is emulated like bf16 and has no loss scaling worth the name)
  fp32  CPU only (a GPU run in fp32 wastes the tensor cores; OpenRLHF's GPU path assumes bf16/fp16)
"""

import functools
import logging
import os
import platform

import torch

from cooper_openrlhf.runtime.registry import Registry

logger = logging.getLogger(__name__)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# vLLM's `dtype` engine argument for each name.
VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

# The run's resolved dtype name, announced once at start-up (`announce_run_dtype`) for the processes started
# after it: Ray workers copy it (runtime/ray_env.py) and vLLM engines are created in it (runtime/cpu.py).
RUN_DTYPE_ENV = "COOPER_OPENRLHF_DTYPE"

# CPU flags (as /proc/cpuinfo spells them) whose presence makes bf16 matmuls native.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # x86-64
BF16_ARM_FEATURES = ("bf16",)  # aarch64 `Features` (BFMMLA / BFDOT)


class DtypeError(ValueError):
    """A dtype that this device cannot or should not run (raised at start-up)."""


DTYPE_CHOICES = Registry("dtype", ("auto", *DTYPES), error=DtypeError)


def cpu_flags(cpuinfo: str) -> set[str]:
    """Every flag named on a `flags` or `Features` line of /proc/cpuinfo text."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


def has_bf16_units(flags: set[str], machine: str | None = None) -> bool:
    """True when these CPU flags mean bf16 matmuls run natively (not emulated)."""
    machine = (machine or platform.machine()).lower()
    wanted = BF16_ARM_FEATURES if machine in ("aarch64", "arm64") else BF16_CPU_FLAGS
    return any(flag in flags for flag in wanted)


CPU_BF16_ENV = "COOPER_CPU_BF16"  # "0" / "1": what `auto` assumes about this CPU, instead of /proc/cpuinfo


@functools.cache
def cpu_has_bf16_units() -> bool:
    """Whether this machine's CPU computes bf16 natively (read once from /proc/cpuinfo; False if unreadable).

    COOPER_CPU_BF16=0 makes a CPU with bf16 units take the fp32 path (to reproduce, on one machine, what a
    CPU without them runs, as CI machines may be); =1 the other way. Processes started from this one inherit it.
    """
    override = os.environ.get(CPU_BF16_ENV)
    if override is not None:
        if override not in ("0", "1"):
            raise ValueError(f"{CPU_BF16_ENV} must be 0 or 1, got {override!r}")
        return override == "1"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        logger.warning("cannot read /proc/cpuinfo; assuming the CPU has no bf16 units (fp32 on CPU)")
        return False
    return has_bf16_units(cpu_flags(text))


def cpu_dtype_reason() -> str:
    """Why `auto` took the dtype it took on this CPU, for the start-up log: the override when one is set (a CPU with
    bf16 units forced onto the fp32 path is not "a CPU without bf16 units"), else what the CPU has."""
    override = os.environ.get(CPU_BF16_ENV)
    if override is not None:
        return f"CPU, {CPU_BF16_ENV}={override}"
    return f"CPU {'with' if cpu_has_bf16_units() else 'without'} bf16 units"


def fast_dtype_name(cuda: bool | None = None) -> str:
    """"bf16" on GPU; on CPU "bf16" where it has bf16 units, else "fp32"."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda:
        return "bf16"
    return "bf16" if cpu_has_bf16_units() else "fp32"


def resolve_dtype_name(name: str, cuda: bool | None = None) -> str:
    """The concrete dtype name for `name` (one of DTYPE_CHOICES) on this device; raises DtypeError on a misfit."""
    DTYPE_CHOICES.check(name)
    if cuda is None:
        cuda = torch.cuda.is_available()
    if name == "auto":
        return fast_dtype_name(cuda)
    if cuda and name == "fp32":
        raise DtypeError("fp32 is a CPU dtype here; on GPU use bf16 (OpenRLHF's default) or auto")
    if not cuda and name == "fp16":
        raise DtypeError("fp16 on CPU is emulated and slow; use auto (the CPU's fast dtype), fp32 or bf16")
    return name


def torch_dtype(name: str, cuda: bool | None = None) -> torch.dtype:
    """torch dtype for a name of DTYPE_CHOICES ("auto" resolved for this device)."""
    return DTYPES[resolve_dtype_name(name, cuda)]


def announce_run_dtype(name: str) -> None:
    """Record the run's resolved dtype (a key of DTYPES) for every process started after this call."""
    if name not in DTYPES:
        raise DtypeError(f"announce a resolved dtype ({list(DTYPES)}), got {name!r}")
    os.environ[RUN_DTYPE_ENV] = name


def run_dtype_name() -> str | None:
    """The dtype announced by this run's start-up, or None when none was (a plain OpenRLHF process)."""
    name = os.environ.get(RUN_DTYPE_ENV)
    return name if name in DTYPES else None
