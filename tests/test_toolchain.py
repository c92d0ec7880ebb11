"""Every process of a run builds DeepSpeed's ops with the same `ninja` (runtime/toolchain.py): two ninja versions
sharing one build folder rebuild each other's ops from scratch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cooper_openrlhf.runtime.toolchain import path_with_tools_first, put_tools_first_on_path, worker_path_var

VENV_BIN = Path(sys.executable).parent


def test_the_tools_folder_goes_first_once_and_the_rest_keeps_its_order():
    tools = Path("/venv/bin")
    assert path_with_tools_first("/usr/bin:/venv/bin:/bin", tools) == "/venv/bin:/usr/bin:/bin"
    assert path_with_tools_first("", tools) == "/venv/bin"
    assert path_with_tools_first("/usr/bin:/bin", None) == "/usr/bin:/bin"


@pytest.mark.skipif(not (VENV_BIN / "ninja").is_file(), reason="this interpreter's folder has no ninja of its own")
def test_a_process_started_without_the_venv_on_path_runs_the_venvs_ninja():
    env = {**os.environ, "PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                                 if Path(p) != VENV_BIN) + os.pathsep + "/usr/bin:/bin"}
    put_tools_first_on_path(env)
    found = subprocess.run(["sh", "-c", "command -v ninja"], env=env, capture_output=True, text=True).stdout.strip()
    assert found == str(VENV_BIN / "ninja")
    assert worker_path_var() == {"PATH": f"{VENV_BIN}{os.pathsep}${{PATH}}"}
