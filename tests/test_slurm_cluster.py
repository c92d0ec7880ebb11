"""The launchers on a real two-node Slurm cluster (scripts/local_slurm.sh: two slurmd on this host), CPU mode.

Nothing is faked: real sbatch/srun/scontrol/scancel, the real scripts submitted as a user would (plain `sbatch
launch_scripts/X.sbatch` and `bash launch_scripts/X.sbatch`), a two-node Ray cluster started by ray_cluster.sh,
train_cooper with tiny models on CPU (GPUS_PER_NODE=0). Skipped, with the reason, where the cluster cannot run
(not root, no apt). Job states come from Slurm's job-completion log (`sacct -c`: this cluster has no slurmdbd).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAUNCH = REPO / "launch_scripts"
LOCAL_SLURM = REPO / "scripts" / "local_slurm.sh"
pytestmark = [pytest.mark.slurm, pytest.mark.slow]

JOB_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def slurm():
    """The local cluster's environment (SLURM_CONF); started here unless already up, stopped after if started here."""
    was_up = subprocess.run(["bash", str(LOCAL_SLURM), "status"], capture_output=True).returncode == 0
    result = subprocess.run(["bash", str(LOCAL_SLURM), "up"], capture_output=True, text=True, timeout=900)
    if result.returncode == 3:
        pytest.skip(result.stderr.strip().splitlines()[-1])
    assert result.returncode == 0, result.stderr
    conf = result.stdout.strip().splitlines()[-1].split("=", 1)[1]
    yield {"SLURM_CONF": conf}
    if not was_up:
        subprocess.run(["bash", str(LOCAL_SLURM), "down"], capture_output=True, timeout=120)


class Kit:
    """Runs Slurm commands and the launchers with the package's Python, on the local cluster, in CPU mode."""

    def __init__(self, slurm_env: dict, tmp: Path, model_dir):
        self.tmp = tmp
        self.models = {name: model_dir(name) for name in ("tiny-qwen2-policy", "tiny-qwen2-rm")}
        self.env = {**os.environ, **slurm_env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                    "PYTHONPATH": str(REPO), "COOPER_PYTHON": sys.executable, "HF_HUB_OFFLINE": "1",
                    "GPUS_PER_NODE": "0", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
        for name in ("SLURM_JOB_ID", "SLURM_JOBID", "COOPER_LAUNCH_DIR", "RAY_ADDRESS"):
            self.env.pop(name, None)

    def sh(self, argv, env=None, cwd=REPO, timeout=300, check=True) -> subprocess.CompletedProcess:
        result = subprocess.run(argv, env={**self.env, **(env or {})}, cwd=cwd, capture_output=True, text=True,
                                timeout=timeout)
        if check:
            assert result.returncode == 0, f"{argv}: {result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    def launch(self, script: str, env: dict, *args, timeout=300) -> str:
        """`bash launch_scripts/SCRIPT` (check, then sbatch itself): the job id."""
        env = {"SBATCH_ARGS": f"--output={self.tmp}/slurm-%x-%A_%a.log " + env.pop("SBATCH_ARGS", ""), **env}
        return self.sh(["bash", str(LAUNCH / script), *args], env, timeout=timeout).stdout.strip().splitlines()[-1]

    def sbatch(self, options: list[str], script: str, env: dict, cwd=REPO) -> str:
        """Plain `sbatch OPTIONS launch_scripts/SCRIPT`, as a user types it (the environment is exported)."""
        return self.sh(["sbatch", "--parsable", f"--output={self.tmp}/slurm-%x-%A_%a.log", *options,
                        str(Path(os.path.relpath(LAUNCH / script, cwd)))], env, cwd=cwd).stdout.strip().split(";")[0]

    def states(self, job: str) -> dict[str, str]:
        """{job id (array: ID_TASK): state} of every finished record of the job, from the completion log."""
        out = self.sh(["sacct", "-c", "-n", "-P", "-j", job, "-o", "JobID,State"], check=False).stdout
        records = {}
        for line in out.splitlines():
            if "|" in line:
                key, state = line.split("|", 1)
                records[key] = state.split()[0]
        return records

    def wait(self, *jobs: str, timeout=JOB_TIMEOUT_S) -> dict[str, str]:
        """Wait until no job is queued or running; their final states."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            queued = self.sh(["squeue", "-h", "-o", "%i", "-j", ",".join(jobs)], check=False).stdout.split()
            if not queued:
                break
            time.sleep(3)
        else:
            self.sh(["scancel", *jobs], check=False)
            pytest.fail(f"jobs {jobs} still queued or running after {timeout} s: {self.logs()}")
        return {job_id: state for job in jobs for job_id, state in self.states(job).items()}

    def state_now(self, job: str) -> str:
        return self.sh(["squeue", "-h", "-o", "%T", "-j", job], check=False).stdout.strip()

    def logs(self) -> str:
        return "\n".join(f"== {p}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.tmp.glob("slurm-*.log")))

    # ---------------------------------------------------------------------------------- data
    def prompts(self, rows: int = 12, heldout: int = 4) -> tuple[str, str]:
        raw = self.tmp / "train.jsonl"
        raw.write_text("".join(json.dumps({"question": f"What is {i} + {i + 1}?", "answer": f"{i} + {i + 1} = {2 * i + 1}"
                                           f"\n#### {2 * i + 1}"}) + "\n" for i in range(rows)))
        prompts, held = self.tmp / "prompts.jsonl", self.tmp / "heldout.jsonl"
        self.sh([sys.executable, "-m", "cooper_openrlhf.cluster.prompts", "--input", str(raw), "--format", "gsm8k",
                 "--out", str(prompts), "--heldout", str(heldout), "--heldout-out", str(held)])
        return str(prompts), str(held)

    def rl_env(self, out: Path, arm: str = "cooper", **extra) -> dict:
        prompts, held = self.prompts()
        return {"ARM": arm, "POLICY": self.models["tiny-qwen2-policy"], "VERIFY_RM": self.models["tiny-qwen2-rm"],
                "ASSISTANT_MODEL": "policy", "PROMPTS": prompts, "EVAL_PROMPTS": held, "EVAL_STEPS": "1",
                "OUT": str(out), **TINY_RL, **extra}


# Two rollout steps of 4 prompts x 2 samples; a checkpoint every step; 16 new tokens.
TINY_RL = {"N_SAMPLES": "2", "ROLLOUT_BATCH_SIZE": "4", "TRAIN_BATCH_SIZE": "8", "MICRO_BATCH_SIZE": "1",
           "ROLLOUT_MICRO_BATCH_SIZE": "2", "NUM_EPISODES": "1", "MAX_LEN": "256", "MAX_NEW_TOKENS": "16",
           "WARMUP_ROLLOUT_STEPS": "0", "SAVE_STEPS": "1", "VERIFIER_WORKERS": "1"}


@pytest.fixture
def kit(slurm, tmp_path, model_dir):
    return Kit(slurm, tmp_path, model_dir)


def scalars(run: Path) -> dict:
    from cooper_openrlhf.report.runs import read_scalars

    return read_scalars(run)


def cluster_processes(port: int) -> list[int]:
    from cooper_openrlhf.cluster.ray_stop import cluster_processes as find

    return [p.pid for p in find(port)]


def launch_record(out: Path) -> dict:
    return json.loads((out / "launch.json").read_text())


# ------------------------------------------------------------------------------------------ RL
def test_an_rl_arm_submitted_by_plain_sbatch_runs_across_both_nodes_and_completes(kit, tmp_path):
    out = tmp_path / "rl-cooper"
    env = kit.rl_env(out, NODES="2")
    job = kit.sbatch(["--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", "--mem=1G", "--oversubscribe"],
                     "cooper_slurm.sbatch", env)
    states = kit.wait(job)
    assert states.get(job) == "COMPLETED", f"{states}\n{kit.logs()}"
    # Both nodes ran a Ray node of one cluster; the job used them.
    assert (out / "logs" / "ray-n1.log").is_file() and (out / "logs" / "ray-n2.log").is_file()
    attempt = launch_record(out)["attempts"][-1]
    assert attempt["nodes"] == "n[1-2]" and attempt["exit"] == 0 and "--ckpt.load_enable" in attempt["command"]
    assert attempt["env"]["ARM"] == "cooper" and attempt["env"]["GPUS_PER_NODE"] == "0"
    info = json.loads((out / "run_info.json").read_text())
    assert (info["arm"], info["status"]) == ("cooper", "done")
    assert (out / "final" / "rm" / "config.json").is_file(), "the co-trained RM export"
    values = scalars(out)
    assert "eval/accuracy" in values, sorted(values)
    assert [step for step, _ in values["eval/accuracy"]], "a held-out evaluation was logged"
    # The arm is named as in a lab run.
    report = kit.sh([sys.executable, "-m", "cooper_openrlhf.cli.report", str(out), "--out", str(tmp_path / "report")])
    assert "cooper" in json.dumps(json.loads((tmp_path / "report" / "summary.json").read_text()))
    assert report.returncode == 0
    port = int(attempt["env"].get("RAY_PORT_BASE", 10000 + int(job) % 20 * 1000))
    assert cluster_processes(port) == [], "a Ray process of the job outlived it"
