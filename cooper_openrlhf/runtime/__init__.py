"""Runtime support that lets OpenRLHF's actors run without CUDA; changes nothing where CUDA exists."""

from cooper_openrlhf.runtime.cpu import cuda_available, install as install_cpu_runtime

__all__ = ["cuda_available", "install_cpu_runtime"]
