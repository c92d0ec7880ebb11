"""OpenRLHF's own DeepspeedStrategy trains on CPU: ZeRO-2 in bf16 and in fp32, gloo, on the tiny reward model."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "zero2_reward_model_steps.py"


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.mark.slow
def test_zero2_bf16_steps_reduce_the_loss(model_dir):
    # A separate process: DeepSpeed initialises torch.distributed, which must not leak into the test session.
    result = subprocess.run(
        [sys.executable, str(SCRIPT), model_dir("tiny-qwen2-rm"), _free_port(), "6"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])

    assert report["zero_stage"] == 2
    assert report["param_dtype"] == "torch.bfloat16"
    losses = report["losses"]
    assert len(losses) == 6
    assert losses[-1] < 0.8 * losses[0], losses
    # The rewards moved toward the labels (1, 0, 1, 0): correct answers now score above wrong ones.
    after = report["rewards_after"]
    assert after[0] > after[1] and after[2] > after[3], after


@pytest.mark.slow
def test_fp32_training_on_cpu_follows_bf16_within_bf16_tolerance(model_dir):
    """--ds.param_dtype fp32 (the CPU's fast dtype without bf16 units) through OpenRLHF's strategy: real DeepSpeed
    ZeRO-2 steps in fp32 give the bf16 run's losses, up to what bf16's 8-bit mantissa explains."""
    reports = {}
    for dtype in ("fp32", "bf16"):
        result = subprocess.run(
            [sys.executable, str(SCRIPT), model_dir("tiny-qwen2-rm"), _free_port(), "4", dtype],
            capture_output=True, text=True, timeout=600,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        reports[dtype] = json.loads(result.stdout.strip().splitlines()[-1])
    assert reports["fp32"]["param_dtype"] == "torch.float32" and reports["bf16"]["param_dtype"] == "torch.bfloat16"
    fp32, bf16 = reports["fp32"]["losses"], reports["bf16"]["losses"]
    assert fp32[0] == pytest.approx(bf16[0], rel=2 ** -7)  # same start: only bf16's rounding of the weights
    assert fp32 == pytest.approx(bf16, abs=0.03)  # the trajectories stay together over the steps
    assert fp32[-1] < fp32[0]  # and fp32 trains
    # A non-finite step is dropped in both (stock DeepSpeed checks only in bf16/fp16; runtime/cpu.py adds fp32).
    assert reports["fp32"]["nan_step_skipped"] and reports["bf16"]["nan_step_skipped"]
