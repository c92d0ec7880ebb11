"""OpenRLHF's own DeepspeedStrategy trains on CPU: ZeRO-2, bf16, gloo, on the tiny reward model."""

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
