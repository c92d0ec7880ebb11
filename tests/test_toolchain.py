"""Every process of a run builds DeepSpeed's ops with the same `ninja` (runtime/toolchain.py): two ninja versions
sharing one build folder rebuild each other's ops from scratch. A build killed midway leaves its lock, on which every
later process loading the op would wait forever: a lock no process holds is removed, a held one never."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cooper_openrlhf.runtime.toolchain import (clear_stale_build_locks, path_with_tools_first, put_tools_first_on_path,
                                               worker_path_var)

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


def _lock(root: Path, op: str, age_s: float) -> Path:
    lock = root / "py311_cpu" / op / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    os.utime(lock, (time.time() - age_s, time.time() - age_s))
    return lock


def test_a_lock_a_killed_build_left_is_removed_and_a_held_or_recent_one_is_kept(tmp_path):
    left = _lock(tmp_path, "fused_adam", age_s=7200)
    recent = _lock(tmp_path, "cpu_adam", age_s=5)  # a build on another node of a shared home may hold it
    held = _lock(tmp_path, "shm_comm", age_s=7200)
    # A build in progress: its process holds the lock's descriptor open (torch's FileBaton), as this child does.
    holder = subprocess.Popen([sys.executable, "-c", f"import os, sys; fd = os.open({str(held)!r}, os.O_RDONLY); "
                                                     "print('open', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        assert clear_stale_build_locks(tmp_path) == [left]
        assert not left.exists() and recent.exists() and held.exists()
    finally:
        holder.communicate("")
    assert clear_stale_build_locks(tmp_path) == [held]  # its build ended without removing it: now stale
