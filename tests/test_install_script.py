"""scripts/install.sh stops early, saying what to do, on a wrong Python or a conflicting torch; a missing
model folder names the install step that makes it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
INSTALL = REPO / "scripts" / "install.sh"


def _install(env_extra: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=120, env=env)


def test_unsupported_python_stops_with_what_to_do(tmp_path):
    # A python that reports 3.9 to the script's version check.
    fake = tmp_path / "python3.9"
    fake.write_text(
        "#!/bin/sh\n"
        f"exec {sys.executable} -c \"import sys; sys.version_info = (3, 9, 0, 'final', 0); exec(sys.stdin.read())\"\n"
    )
    fake.chmod(0o755)
    result = _install({"PYTHON": str(fake), "COOPER_VENV": str(tmp_path / "venv")})
    assert result.returncode != 0
    assert "needs Python 3.10-3.12" in result.stderr and "set PYTHON=" in result.stderr
    assert not (tmp_path / "venv").exists()  # stopped before creating anything


def test_conflicting_torch_stops_with_what_to_do(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    dist = site / "torch-2.5.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.5.1\n")
    result = _install({"COOPER_VENV": str(venv)})
    assert result.returncode != 0
    assert "torch 2.5.1 is installed" in result.stderr and "pinned to torch 2.13.0" in result.stderr
    assert "COOPER_VENV=" in result.stderr


def test_missing_model_folder_names_the_install_step(tmp_path, monkeypatch):
    from cooper_openrlhf.models import ModelNotMaterializedError, model_path

    monkeypatch.setenv("COOPER_MODELS_DIR", str(tmp_path))
    with pytest.raises(ModelNotMaterializedError, match="scripts/install.sh"):
        model_path("smollm2-135m-instruct")
