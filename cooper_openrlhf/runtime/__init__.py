"""Runtime support that lets OpenRLHF's actors run without CUDA; changes nothing where CUDA exists.

`cuda_available` and `install_cpu_runtime` are loaded on first use: they import torch, which the light modules of
this layer (`runtime.secrets`, used by the launchers' dry runs) do without.
"""

__all__ = ["cuda_available", "install_cpu_runtime"]


def __getattr__(name: str):
    if name in __all__:
        from cooper_openrlhf.runtime import cpu

        return {"cuda_available": cpu.cuda_available, "install_cpu_runtime": cpu.install}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
