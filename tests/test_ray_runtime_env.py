"""The Ray runtime env: one builder for the launcher's job and the driver's ray.init, merged as Ray requires.

The unit tests pin what each side passes; `test_train_cooper_start_up_inside_a_submitted_job` runs the real thing:
a local `ray start --head`, `ray job submit` with the env the launchers pass, and train_cooper's own start-up
inside the job, up to one remote call.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cooper_openrlhf.runtime.ray_env import (
    CPU_SETUP_HOOK,
    RAY_JOB_CONFIG_ENV,
    cooper_runtime_env,
    driver_runtime_env,
    without_job_fields,
)
from cooper_openrlhf.runtime.toolchain import worker_path_var


def test_gpu_env_is_stocks_with_the_environments_values_and_no_cpu_runtime():
    env = cooper_runtime_env({"NCCL_DEBUG": "INFO", "HF_HUB_OFFLINE": "1", "UNRELATED": "x"}, on_cpu=False)
    assert env == {"env_vars": {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "INFO",
                                "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1", "HF_HUB_OFFLINE": "1", **worker_path_var()}}


def test_cpu_env_installs_the_cpu_runtime_in_every_worker():
    env = cooper_runtime_env({"OMP_NUM_THREADS": "8"}, on_cpu=True)
    assert env["worker_process_setup_hook"] == CPU_SETUP_HOOK
    assert env["env_vars"]["OMP_NUM_THREADS"] == "1" and env["env_vars"]["DS_ACCELERATOR"] == "cpu"


def test_the_driver_adds_only_what_the_submitted_job_lacks():
    job = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "NCCL_DEBUG": "WARN"}, "working_dir": "/x"}
    environ = {RAY_JOB_CONFIG_ENV: json.dumps({"runtime_env": job}), "TOKENIZERS_PARALLELISM": "false"}
    driver = driver_runtime_env(environ, on_cpu=False)
    assert driver == {"env_vars": {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1", **worker_path_var()}}
    # Outside a submitted job the driver passes the whole env; a job that set everything leaves nothing to add.
    assert driver_runtime_env({}, on_cpu=False) == cooper_runtime_env({}, on_cpu=False)
    own = cooper_runtime_env({}, on_cpu=True)
    assert without_job_fields(own, own) == {}


# ------------------------------------------------------------------------------------ the real path
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path_factory):
    """A Ray head of this test's own (dashboard and job API on 127.0.0.1), stopped by the pids it started:
    `ray stop` would stop every Ray process on the machine."""
    ray_bin = Path(sys.executable).with_name("ray")
    temp_dir = Path("/tmp") / f"cooper_rt_{os.getpid()}"  # Ray's socket paths must stay short
    port, dashboard, agent_http, agent_grpc, metrics, runtime_env_agent = (_free_port() for _ in range(6))
    # A clean environment: this pytest process has the CPU runtime's variables set (conftest), and a head
    # started with them would hand them to every worker whatever the job's env says.
    env = {k: v for k, v in os.environ.items() if k not in ("COOPER_OPENRLHF_CPU_RUNTIME", "DS_ACCELERATOR")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # A bare `ray start`, as on a node where the venv is not activated: its bin folder is not on PATH.
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != ray_bin.parent)
    before = _ray_pids(str(temp_dir))
    subprocess.run([str(ray_bin), "start", "--head", f"--port={port}", "--num-cpus=2", "--num-gpus=0",
                    "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
                    # Ports of its own: a head's job agent that finds its default port taken (another Ray on the
                    # machine) never registers, and every submission answers "No available agent".
                    f"--dashboard-agent-listen-port={agent_http}", f"--dashboard-agent-grpc-port={agent_grpc}",
                    f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env_agent}",
                    f"--temp-dir={temp_dir}", "--disable-usage-stats"],
                   check=True, env=env, capture_output=True, timeout=180)
    try:
        yield {"ray": ray_bin, "address": f"http://127.0.0.1:{dashboard}", "env": env}
    finally:
        for pid in _ray_pids(str(temp_dir)) - before:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(2)
        for pid in _ray_pids(str(temp_dir)) - before:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp_dir, ignore_errors=True)


def _ray_pids(marker: str) -> set[int]:
    """Processes whose command line names this head's temp dir (gcs, raylet, dashboard, workers)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.add(int(proc.name))
            except OSError:
                pass
    return pids


JOB = textwrap.dedent("""
    import os, ray, shutil
    from cooper_openrlhf.cli.train_cooper import start_ray

    start_ray()  # exactly train_cooper's start-up

    @ray.remote(num_cpus=0)
    def worker_env():
        keys = ("NCCL_DEBUG", "TOKENIZERS_PARALLELISM", "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS",
                "COOPER_OPENRLHF_CPU_RUNTIME")
        return {**{k: os.environ.get(k) for k in keys}, "ninja": shutil.which("ninja")}

    print("WORKER_ENV", __import__("json").dumps(ray.get(worker_env.remote())), flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("on_cpu", [False, True], ids=["gpu-plan-env", "cpu-job-env"])
def test_train_cooper_start_up_inside_a_submitted_job(ray_head, tmp_path, on_cpu):
    """Every Slurm RL launch: `ray job submit --runtime-env-json <plan's env>` then train_cooper's ray.init inside
    the job. Ray refused the merge when both named the same variables."""
    job_env = cooper_runtime_env({"TOKENIZERS_PARALLELISM": "false", "NCCL_DEBUG": "WARN"}, on_cpu=on_cpu)
    (tmp_path / "job.py").write_text(JOB)
    for attempt in range(10):  # a fresh head's job agent takes a few seconds to register, as on a cluster
        result = subprocess.run(
            [str(ray_head["ray"]), "job", "submit", f"--address={ray_head['address']}",
             f"--runtime-env-json={json.dumps(job_env)}", "--", sys.executable, str(tmp_path / "job.py")],
            env=ray_head["env"], capture_output=True, text=True, timeout=300)
        output = result.stdout + result.stderr
        if "No available agent" not in output:
            break
        time.sleep(3)
    assert result.returncode == 0, output[-3000:]
    assert "Failed to merge" not in output
    seen = json.loads(output.split("WORKER_ENV", 1)[1].splitlines()[0])
    assert seen["NCCL_DEBUG"] == "WARN" and seen["TOKENIZERS_PARALLELISM"] == "false"
    assert seen["RAY_ENABLE_ZERO_COPY_TORCH_TENSORS"] == "1"  # added by the driver, not by the job
    assert seen["COOPER_OPENRLHF_CPU_RUNTIME"] == ("1" if on_cpu else None)
    # DeepSpeed's op builds run the interpreter's own ninja in every worker, whatever PATH `ray start` had.
    assert seen["ninja"] == str(Path(sys.executable).with_name("ninja"))


def test_a_package_only_the_current_folder_can_import_is_refused_before_ray_starts(tmp_path, monkeypatch):
    """Ray's workers start in a folder of their own: a module importable only from the driver's folder would kill
    every actor with ModuleNotFoundError; the driver says so first, naming the fix."""
    from cooper_openrlhf.runtime.ray_env import WorkersCannotImportError, check_workers_can_import

    check_workers_can_import()  # installed: a Python started anywhere imports it
    (tmp_path / "only_here_pkg").mkdir()
    (tmp_path / "only_here_pkg" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("only_here_pkg")  # this process imports it from its folder...
    with pytest.raises(WorkersCannotImportError, match=r"could not import only_here_pkg.*pip install -e"):
        check_workers_can_import("only_here_pkg")  # ...a worker could not
    check_workers_can_import("only_here_pkg", {**os.environ, "PYTHONPATH": str(tmp_path)})  # on PYTHONPATH: fine
