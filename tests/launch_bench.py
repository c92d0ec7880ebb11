"""The Slurm launchers' test bench (test_launch_scripts.py, test_launch_secrets.py): fake `sbatch`/`srun`/`scontrol`/
`ray` at the Slurm boundary (tests/slurm_shims), a shell that runs a launcher with them, and the models and prompts
a launcher checks."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAUNCH = REPO / "launch_scripts"
SHIMS = Path(__file__).resolve().parent / "slurm_shims"


def _model(path: Path) -> str:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return str(path)


def _reward_model(path) -> str:
    """A folder whose config is a one-logit sequence classifier's (what VERIFY_RM must hold)."""
    _model(path)
    (path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForSequenceClassification"],
                                                  "model_type": "qwen2", "num_labels": 1}))
    return str(path)


class Shell:
    """Runs a launcher with the shims first on PATH; `calls(tool)` reads what the shims recorded."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.log = tmp_path / "shim.log"
        self.state = tmp_path / "ray-state"
        self.env = {
            "PATH": f"{SHIMS}:{Path(sys.executable).parent}:{os.environ['PATH']}",
            "PYTHONPATH": str(REPO), "COOPER_PYTHON": sys.executable, "SHIM_PYTHON": sys.executable,
            "COOPER_RAY": "ray",  # PATH's: the shim (else the launchers take the `ray` beside COOPER_PYTHON)
            "SHIM_LOG": str(self.log), "FAKE_RAY_STATE": str(self.state), "HOME": os.environ.get("HOME", "/tmp"),
            "PYTHONWARNINGS": "ignore",
        }

    def run(self, script: str, env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        started = time.monotonic()
        result = subprocess.run(["bash", str(LAUNCH / script), *args], env={**self.env, **env}, capture_output=True,
                                text=True, timeout=timeout)
        result.seconds = time.monotonic() - started
        return result

    def calls(self, tool: str) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [call for call in map(json.loads, self.log.read_text().splitlines()) if call[0] == tool]

    def stopped_nodes(self) -> list[str]:
        """Nodes on which the launcher ran cluster/ray_stop.py (as `@node`, sorted)."""
        return sorted("@" + next(a.split("=", 1)[1] for a in call if a.startswith("--nodelist="))
                      for call in self.calls("srun") if "cooper_openrlhf.cluster.ray_stop" in call)

    def leftover_steps(self) -> list[int]:
        """Fake `ray start --block` processes still running (each would hold a node's GPUs)."""
        alive = []
        for pid_file in (self.state / "pids").glob("*") if (self.state / "pids").is_dir() else []:
            pid = int(pid_file.read_text())
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        return alive


@pytest.fixture
def shell(tmp_path):
    shell = Shell(tmp_path)
    yield shell
    for pid in shell.leftover_steps():  # never leave a fake step behind, even when an assertion failed
        os.kill(pid, 9)


@pytest.fixture
def rl_env(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": str(i + 1), "instruction": "boxed"}) + "\n"
                               for i in range(64)))
    return {"POLICY": _model(tmp_path / "policy"), "VERIFY_RM": _reward_model(tmp_path / "rm"), "ASSISTANT_MODEL": "policy",
            "PROMPTS": str(prompts), "OUT": str(tmp_path / "out"), "ROLLOUT_BATCH_SIZE": "8", "TRAIN_BATCH_SIZE": "32"}
