"""The CPU's fast dtype: detection from CPU flags and the rules of `--ds.param_dtype auto|bf16|fp16|fp32`."""

import pytest
import torch

from cooper_openrlhf.runtime.dtype import DtypeError, cpu_flags, has_bf16_units, resolve_dtype_name, torch_dtype

EPYC_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_cpu_flags_are_read_from_flags_and_features_lines():
    assert {"avx2", "fma"} <= cpu_flags(EPYC_AVX2)
    assert "bf16" in cpu_flags(GRAVITON3)


@pytest.mark.parametrize("cpuinfo, machine, expected", [
    (EPYC_AVX2, "x86_64", False),
    (SAPPHIRE_RAPIDS, "x86_64", True),
    (GRAVITON3, "aarch64", True),
    ("Features\t: fp asimd\n", "aarch64", False),
])
def test_bf16_units_are_detected_from_the_cpu_flags(cpuinfo, machine, expected):
    assert has_bf16_units(cpu_flags(cpuinfo), machine) is expected


def test_auto_is_bf16_on_gpu_and_the_fast_dtype_on_cpu(monkeypatch):
    from cooper_openrlhf.runtime import dtype

    assert resolve_dtype_name("auto", cuda=True) == "bf16"
    monkeypatch.setattr(dtype, "cpu_has_bf16_units", lambda: False)
    assert resolve_dtype_name("auto", cuda=False) == "fp32"
    assert torch_dtype("auto", cuda=False) is torch.float32
    monkeypatch.setattr(dtype, "cpu_has_bf16_units", lambda: True)
    assert resolve_dtype_name("auto", cuda=False) == "bf16"


@pytest.mark.parametrize("name, cuda, message", [("fp32", True, "CPU dtype"), ("fp16", False, "emulated"),
                                                 ("int8", False, "valid")])
def test_a_dtype_that_misfits_the_device_fails_with_what_to_use(name, cuda, message):
    with pytest.raises(DtypeError, match=message):
        resolve_dtype_name(name, cuda=cuda)


def test_explicit_dtypes_pass_through_where_they_fit():
    assert resolve_dtype_name("bf16", cuda=False) == "bf16"
    assert resolve_dtype_name("fp32", cuda=False) == "fp32"
    assert resolve_dtype_name("fp16", cuda=True) == "fp16"


def test_cooper_cpu_bf16_overrides_the_cpus_own_flags_in_this_and_child_processes(monkeypatch):
    import subprocess
    import sys

    from cooper_openrlhf.runtime import dtype

    child = [sys.executable, "-c", "from cooper_openrlhf.runtime.dtype import fast_dtype_name; print(fast_dtype_name(cuda=False))"]
    for value, expected in (("0", "fp32"), ("1", "bf16")):
        monkeypatch.setenv(dtype.CPU_BF16_ENV, value)
        dtype.cpu_has_bf16_units.cache_clear()
        assert dtype.fast_dtype_name(cuda=False) == expected
        assert subprocess.run(child, capture_output=True, text=True, check=True).stdout.strip() == expected
    monkeypatch.setenv(dtype.CPU_BF16_ENV, "yes")
    dtype.cpu_has_bf16_units.cache_clear()
    with pytest.raises(ValueError, match="COOPER_CPU_BF16 must be 0 or 1"):
        dtype.cpu_has_bf16_units()
    monkeypatch.delenv(dtype.CPU_BF16_ENV)
    dtype.cpu_has_bf16_units.cache_clear()


def test_the_start_up_log_names_the_override_that_chose_fp32_rather_than_blaming_the_cpu(monkeypatch, caplog):
    """`auto -> fp32` on a CPU with bf16 units forced onto the fp32 path (COOPER_CPU_BF16=0, as the lab's batches
    run) says so; without the override it names what the CPU has."""
    import argparse

    from cooper_openrlhf.runtime import dtype
    from cooper_openrlhf.runtime.openrlhf_args import resolve_param_dtype

    def resolved_log() -> str:
        caplog.clear()
        resolve_param_dtype(argparse.Namespace(**{"ds.param_dtype": "auto"}), gpu_run=False)
        return caplog.text

    monkeypatch.setenv(dtype.RUN_DTYPE_ENV, "fp32")  # resolving announces the dtype: put back what was there after
    monkeypatch.setenv(dtype.CPU_BF16_ENV, "0")
    dtype.cpu_has_bf16_units.cache_clear()
    with caplog.at_level("WARNING"):
        assert "--ds.param_dtype auto -> fp32 (CPU, COOPER_CPU_BF16=0)" in resolved_log()
        monkeypatch.delenv(dtype.CPU_BF16_ENV)
        dtype.cpu_has_bf16_units.cache_clear()
        units = "with" if dtype.cpu_has_bf16_units() else "without"
        assert f"(CPU {units} bf16 units)" in resolved_log()
    dtype.cpu_has_bf16_units.cache_clear()
