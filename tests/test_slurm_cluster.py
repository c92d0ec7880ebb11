"""The launchers on a real two-node Slurm cluster (scripts/local_slurm.sh: two slurmd on this host), CPU mode.

Nothing is faked: real sbatch/srun/scontrol/scancel, the real scripts submitted as a user would (plain `sbatch
launch_scripts/X.sbatch` and `bash launch_scripts/X.sbatch`), a two-node Ray cluster started by ray_cluster.sh,
train_cooper with tiny models on CPU (GPUS_PER_NODE=0). Skipped, with the reason, where the cluster cannot run
(not root, no apt). Final job states come from `scontrol show job` (this cluster has no slurmdbd for sacct; the
controller keeps finished jobs for MinJobAge = 3600 s).
"""

import json
import os
import re
import shutil
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
# Final states of a job that did not complete (a requeued job is PENDING again, not one of these).
CHAIN_ENDS = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}

# COOPER_SAVE_MOMENT_HOOK (ray/checkpoints.py) for the chain's arm: at PREEMPT_AT (moment:tag), once, the job
# sends itself USR1 (what Slurm sends before the time limit) and the save is held there until the requeue ends the
# trainer, so the preemption lands at that moment on any machine, however fast.
PREEMPT_HOOK = """#!/bin/bash
[[ "$1:$2" == "$PREEMPT_AT" && ! -e "$PREEMPT_FIRED" ]] || exit 0
echo "$1 $2 job $SLURM_JOB_ID" > "$PREEMPT_FIRED"
scancel --batch --signal=USR1 "$SLURM_JOB_ID"
exec tail --pid="$PPID" -f /dev/null
"""


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
        # A judge that answers yes/no (the tiny policy's verdicts are all undecided: annotation would keep no row),
        # and a second generator that is sometimes right (VerifyRM training refuses a one-class data set).
        self.judge = model_dir("smollm2-135m-instruct")
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

    def sbatch(self, options: list[str], script: str, env: dict, *args: str, cwd=REPO) -> str:
        """Plain `sbatch OPTIONS launch_scripts/SCRIPT ARGS`, as a user types it (the environment is exported)."""
        return self.sh(["sbatch", "--parsable", f"--output={self.tmp}/slurm-%x-%A_%a.log", *options,
                        str(Path(os.path.relpath(LAUNCH / script, cwd))), *args], env, cwd=cwd).stdout.strip().split(";")[0]

    def states(self, job: str) -> dict[str, str]:
        """{job id (array task: ID_TASK): final state}, from `scontrol show job` (kept MinJobAge=3600 s after the end)."""
        out = self.sh(["scontrol", "-o", "show", "job", job], check=False).stdout
        records = {}
        for line in out.splitlines():
            fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
            key = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}" if "ArrayTaskId" in fields else fields["JobId"]
            records[key] = fields["JobState"]
        return records

    def wait(self, *jobs: str, timeout=JOB_TIMEOUT_S, chain: bool = False) -> dict[str, str]:
        """Wait until no job is queued or running; their final states. A `chain` (jobs that must all complete)
        fails at once, with the job's log tail, when one of them fails or waits on a dependency that can never be
        satisfied, rather than at the timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            queued = self.sh(["squeue", "-h", "-o", "%i", "-j", ",".join(jobs)], check=False).stdout.split()
            if not queued:
                break
            if chain:
                self.fail_if_the_chain_cannot_run(jobs)
            time.sleep(3)
        else:
            self.sh(["scancel", *jobs], check=False)
            pytest.fail(f"jobs {jobs} still queued or running after {timeout} s: {self.logs()}")
        return {job_id: state for job in jobs for job_id, state in self.states(job).items()}

    def fail_if_the_chain_cannot_run(self, jobs) -> None:
        """Fail now, cancelling the chain, when a job of it ended other than COMPLETED or is held by a dependency
        that can never be satisfied (a job before it failed): the rest of the chain would never run."""
        for job in jobs:
            out = self.sh(["scontrol", "-o", "show", "job", job], check=False).stdout
            for line in out.splitlines():
                fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
                state, reason = fields.get("JobState"), fields.get("Reason")
                if state in CHAIN_ENDS or reason == "DependencyNeverSatisfied":
                    self.sh(["scancel", *jobs], check=False)
                    pytest.fail(f"job {fields['JobId']} of the chain {jobs} is {state} ({reason}): the chain cannot "
                                f"complete\n{self.job_log_tail(job)}")

    def job_log_tail(self, job: str, tail: int = 6000) -> str:
        """The Slurm output of a job (every array task's), and the RL run's job.log when the job is an arm."""
        files = sorted(self.tmp.glob(f"slurm-*-{job}_*.log")) + sorted(self.tmp.glob(f"slurm-*-{job}.log"))
        files += [p for p in self.tmp.rglob("logs/job.log") if f"{job}" in p.read_text(errors="replace")]
        return "\n".join(f"== {p}\n{p.read_text(errors='replace')[-tail:]}" for p in files) or self.logs()

    def state_now(self, job: str) -> str:
        return self.sh(["squeue", "-h", "-o", "%T", "-j", job], check=False).stdout.strip()

    def logs(self, tail: int | None = 3000) -> str:
        """Every Slurm output file of the test, then every Ray node's log (each cut to its last `tail` characters:
        for failure messages)."""
        files = sorted(self.tmp.glob("slurm-*.log")) + sorted(self.tmp.rglob("logs/ray-*.log"))
        return "\n".join(f"== {p}\n{p.read_text(errors='replace')[-tail if tail else 0:]}" for p in files)

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
    from cooper_openrlhf.ray.run_logs import read_scalars

    return read_scalars(run)


def cluster_processes(port: int) -> list[int]:
    from cooper_openrlhf.cluster.ray_stop import cluster_processes as find

    return [p.pid for p in find(port)]


def ray_port(kit: "Kit", job: str) -> int:
    """The GCS port of a job's Ray cluster, as its output says it (`Ray head: n1 (IP:PORT, ...`)."""
    found = re.findall(r"Ray head: \S+ \([^:]+:(\d+),", "".join(
        p.read_text(errors="replace") for p in kit.tmp.glob(f"slurm-*-{job}_*.log")))
    assert found, f"job {job} printed no Ray head line\n{kit.logs()}"
    return int(found[-1])


def job_processes(job: str) -> list[int]:
    """Processes on this host started by the job (Slurm puts SLURM_JOB_ID in every step's environment; Ray's
    raylets and workers inherit it)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"SLURM_JOB_ID={job}".encode() in environ:
                found.append(int(proc.name))
    return found


def wait_for(predicate, timeout: float, what: str, kit: "Kit", job: str | None = None):
    """Wait until `predicate()`; fail at once, with the logs, when `job` ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if job and not kit.state_now(job):
            if predicate():
                return
            pytest.fail(f"job {job} ended ({kit.states(job)}) before {what}\n{kit.logs()}")
        time.sleep(2)
    pytest.fail(f"{what} did not happen within {timeout} s\n{kit.logs()}")


def attempts_steps(log: Path) -> list[list[int]]:
    """The global steps each attempt of a run logged, from its job.log (attempts split at ray job submit's start)."""
    attempts = []
    for line in log.read_text(errors="replace").splitlines():
        if "Running entrypoint for job" in line:
            attempts.append([])
        match = re.search(r"Global step (\d+):", line)
        if match and attempts and (not attempts[-1] or attempts[-1][-1] != int(match[1])):
            attempts[-1].append(int(match[1]))
    return attempts


def launch_record(out: Path) -> dict:
    return json.loads((out / "launch.json").read_text())


# ------------------------------------------------------------------------------------------ RL
def test_scancel_of_a_running_arm_by_plain_sbatch_leaves_no_ray_process_and_no_step(kit, tmp_path):
    out = tmp_path / "rl-static"
    job = kit.sbatch(["--gpus-per-node=0", "--cpus-per-task=1", "--mem=1G", "--oversubscribe"], "cooper_slurm.sbatch",
                     kit.rl_env(out, arm="static"))
    log = out / "logs" / "job.log"
    wait_for(lambda: log.is_file() and "Running entrypoint" in log.read_text(errors="replace"), JOB_TIMEOUT_S,
             "the job's driver start", kit, job)
    assert job_processes(job), "the job runs processes here"
    kit.sh(["scancel", job])
    kit.wait(job)
    wait_for(lambda: not job_processes(job), 60, "the end of every process of the job", kit)
    assert cluster_processes(ray_port(kit, job)) == []
    assert kit.sh(["squeue", "-h", "-s", "-j", job], check=False).stdout.strip() == ""


# COOPER_SAVE_MOMENT_HOOK for the save-on-signal test: after step 2's best save (evaluation follows the step's
# checkpoint check, so the request waits for step 3) the job sends itself USR1, and the trainer goes on once the
# job has asked for a checkpoint (the request is then pending when step 3 ends, however fast the steps); while the
# answer stands (the first attempt: the next one's driver removes it) the scheduled save of step 4 is held until
# the requeue ends the trainer, so step 3's checkpoint stays the newest however slow the requeue.
SIGNAL_HOOK = """#!/bin/bash
if [[ "$1:$2" == after_marker:best_global_step2 && ! -e "$SIGNAL_SENT" ]]; then
  echo "job $SLURM_JOB_ID" > "$SIGNAL_SENT"
  scancel --batch --signal=USR1 "$SLURM_JOB_ID"
  for _ in $(seq 600); do [[ -e "$REQUEST" ]] && exit 0; sleep 0.1; done
  exit 1
fi
if [[ "$1:$2" == before_policy_save:global_step4 && -e "$REQUEST.done" ]]; then  # the answer stands: attempt 1
  exec tail --pid="$PPID" -f /dev/null
fi
"""


def test_usr1_checkpoints_the_step_in_flight_then_requeues_and_the_next_attempt_goes_on_after_it(kit, tmp_path):
    """USR1 (what Slurm sends SIGNAL_MARGIN before the time limit) during step 3 of a run that saves every 4 steps
    and evaluates every 2: the job asks the trainer for a checkpoint, the trainer saves step 3 as one unit (policy
    and RM) when it ends, the job requeues itself once answered, and the next attempt resumes at step 3 where it
    would have redone step 3 from step 2's best checkpoint."""
    out = tmp_path / "rl-cooper"
    hook = tmp_path / "signal_hook.sh"
    hook.write_text(SIGNAL_HOOK)
    hook.chmod(0o755)
    env = kit.rl_env(out, SAVE_STEPS="4", EVAL_STEPS="2", NUM_EPISODES="3")  # 6 steps
    env.update({"COOPER_SAVE_MOMENT_HOOK": str(hook), "SIGNAL_SENT": str(tmp_path / "signal_sent"),
                "REQUEST": str(out / "ckpt" / "save_request")})
    job = kit.sbatch(["--gpus-per-node=0", "--cpus-per-task=1", "--mem=1G", "--oversubscribe"], "cooper_slurm.sbatch",
                     env)
    states = kit.wait(job, timeout=2 * JOB_TIMEOUT_S)
    assert states == {job: "COMPLETED"}, f"{states}\n{kit.logs()}"
    assert (tmp_path / "signal_sent").read_text().split() == ["job", job], "USR1 was sent after step 2's best save"

    slurm_log = kit.logs(tail=None)
    order = [slurm_log.find(s) for s in ("USR1: asked the trainer for a checkpoint of the step in flight",
                                         "USR1: the trainer saved global_step3", "requeueing job")]
    assert -1 not in order and order == sorted(order), f"asked, answered, then requeued\n{slurm_log[-4000:]}"
    log = out / "logs" / "job.log"
    text = log.read_text(errors="replace")
    assert re.findall(r"resuming at step .*", text) == [
        "resuming at step 3 from the policy's global_step3 and the RM's global_step3"]
    # Attempt 1 trained step 3 (its checkpoint is the one resumed from above), but the line of step 3 can be lost with
    # the attempt: Ray forwards an actor's log to the driver asynchronously, and the requeue ends the forwarding.
    first, second = attempts_steps(log)
    assert first[:2] == [1, 2] and first[2:] in ([], [3], [3, 4]) and second == [4, 5, 6], (first, second)
    # What the trainer printed is kept whole, per attempt and node, from Ray's own log files.
    for attempt, steps in ((1, {1, 2, 3}), (2, {4, 5, 6})):
        kept = sorted((out / "logs" / "ray-logs" / f"attempt-{attempt}").glob("*/worker-*"))
        printed = {int(m) for path in kept for m in re.findall(r"Global step (\d+):", path.read_text(errors="replace"))}
        assert steps <= printed <= steps | {4}, (attempt, printed, kept)
    attempts = launch_record(out)["attempts"]
    assert [a["restart_count"] for a in attempts] == [0, 1] and attempts[1]["exit"] == 0
    assert not (out / "ckpt" / "save_request").exists() and not (out / "ckpt" / "save_request.done").exists()


# ------------------------------------------------------------------------------------- bad input
def test_bad_input_is_refused_before_anything_starts_naming_the_variable_or_folder(kit, tmp_path):
    queued_before = kit.sh(["squeue", "-h", "-o", "%i"]).stdout.split()
    env = kit.rl_env(tmp_path / "rl")
    missing = kit.sh(["bash", str(LAUNCH / "cooper_slurm.sbatch")], {**env, "PROMPTS": ""}, check=False)
    assert missing.returncode == 2 and "PROMPTS is not set" in missing.stderr
    wrong = kit.sh(["bash", str(LAUNCH / "cooper_slurm.sbatch")], {**env, "N_SAMPLES": "two"}, check=False)
    assert wrong.returncode == 2 and "N_SAMPLES='two': must be an integer" in wrong.stderr

    # A checkpoint folder written by another configuration (here: 2 samples per prompt, now 4).
    out = tmp_path / "rl"
    from cooper_openrlhf.cluster.checks import Env
    from cooper_openrlhf.cluster.launch_record import record_attempt
    from cooper_openrlhf.cli.launch_plans import plan_rl

    planned = Env({**kit.env, **env, "SLURM_JOB_ID": "1"})
    plan = plan_rl(planned)
    record_attempt(str(out / "launch.json"), plan, plan.commands[0], planned)
    (out / "ckpt" / "_actor" / "global_step1").mkdir(parents=True)
    again = kit.sh(["bash", str(LAUNCH / "cooper_slurm.sbatch")], env, check=False)
    assert again.returncode == 0, again.stderr  # the same configuration resumes
    kit.sh(["scancel", again.stdout.strip().splitlines()[-1]])
    other = kit.sh(["bash", str(LAUNCH / "cooper_slurm.sbatch")], {**env, "N_SAMPLES": "4", "TRAIN_BATCH_SIZE": "16"},
                   check=False)
    assert other.returncode == 2, other.stderr
    assert f"OUT={out}: its checkpoint folder {out / 'ckpt'} was written by another configuration" in other.stderr
    assert "--rollout.n_samples_per_prompt: '2' then, '4' now" in other.stderr
    assert sorted(kit.sh(["squeue", "-h", "-o", "%i"]).stdout.split()) == sorted(queued_before)

    # More nodes asked than the job was given: the job refuses before Ray starts, naming NODES.
    out = tmp_path / "rl-nodes"
    job = kit.sbatch(["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1", "--mem=1G", "--oversubscribe"],
                     "cooper_slurm.sbatch", {**kit.rl_env(out), "NODES": "2"})
    assert kit.wait(job, timeout=300).get(job) == "FAILED"
    assert "NODES=2: the job's allocation has 1 node(s)" in kit.logs()
    assert not (out / "logs").exists(), "nothing started"

    # Outside a checkout, without COOPER_LAUNCH_DIR: the job cannot find the kit and says how to fix it.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(LAUNCH / "report.sbatch", elsewhere / "report.sbatch")
    job = kit.sh(["sbatch", "--parsable", f"--output={kit.tmp}/slurm-lost-%j.log", "report.sbatch"], cwd=elsewhere,
                 env={"RUN_DIRS": str(tmp_path), "OUT": str(tmp_path / "r")}).stdout.strip()
    assert kit.wait(job, timeout=120).get(job) == "FAILED"
    assert "cannot find the launch kit" in kit.logs() and "COOPER_LAUNCH_DIR" in kit.logs()


# --------------------------------------------------------------------------- the other launchers
def _labelled(path: Path, questions: int = 8) -> str:
    rows = []
    for i in range(questions):
        rows.append({"question": f"What is {i} + 2?", "reference": str(i + 2), "completion": f"It is {i + 2}.", "label": 1})
        rows.append({"question": f"What is {i} + 2?", "reference": str(i + 2), "completion": "I do not know.", "label": 0})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _benchmarks(root: Path) -> str:
    (root / "gsm8k").mkdir(parents=True)
    (root / "gsm8k" / "test.jsonl").write_text("".join(
        json.dumps({"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}) + "\n" for i in range(2)))
    return str(root)


CPU_ARRAY = ["--gpus=0", "--cpus-per-task=1", "--mem=1G", "--oversubscribe"]


def test_plain_sbatch_of_the_annotate_train_evaluate_and_report_launchers(kit, tmp_path):
    policy, rm = kit.models["tiny-qwen2-policy"], kit.models["tiny-qwen2-rm"]
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question": f"What is {i} + 2?", "reference": str(i + 2)}) + "\n"
                                 for i in range(4)))
    annotate = kit.sbatch(["--array=0-1", *CPU_ARRAY], "verifyrm_annotate.sbatch", {
        "PROMPTS": str(questions), "GENERATORS": policy, "JUDGE": policy, "OUT": str(tmp_path / "annotate"),
        "SHARDS": "2", "SAMPLES_PER_QUESTION": "1", "GEN_MAX_NEW_TOKENS": "8", "ANNOTATE_VERIFIER_WORKERS": "1"})
    train = kit.sbatch(["--gpus-per-node=0", "--cpus-per-task=1", "--mem=1G", "--oversubscribe"], "verifyrm_train.sbatch", {
        "PRETRAIN": rm, "DATA": _labelled(tmp_path / "labelled.jsonl"), "OUT": str(tmp_path / "verifyrm"), "EPOCHS": "1",
        "RM_TRAIN_BATCH_SIZE": "4", "RM_MICRO_BATCH_SIZE": "2", "MAX_LENGTH": "64"})
    evaluate = kit.sbatch(["--array=0-1", *CPU_ARRAY], "evaluate.sbatch", {
        "CHECKPOINTS": f"{policy},{policy}", "DATA_DIR": _benchmarks(tmp_path / "bench"), "BENCHMARKS": "gsm8k",
        "OUT": str(tmp_path / "eval"), "PROTOCOL": "greedy", "LIMIT": "2"}, "--max-new-tokens", "8")
    run = tmp_path / "runs" / "some-arm"
    run.mkdir(parents=True)
    (run / "run_info.json").write_text(json.dumps({"arm": "rule", "seed": 3}))
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(run / "tensorboard")) as writer:
        for step in (1, 2):
            writer.add_scalar("eval/accuracy", 0.25 * step, step)
    report = kit.sbatch(["--gpus=0", "--cpus-per-task=1", "--mem=1G", "--oversubscribe"], "report.sbatch",
                        {"RUN_DIRS": str(run), "OUT": str(tmp_path / "report")})
    states = kit.wait(annotate, train, evaluate, report)
    expected = {f"{annotate}_0", f"{annotate}_1", train, f"{evaluate}_0", f"{evaluate}_1", report}
    assert set(states) == expected and set(states.values()) == {"COMPLETED"}, f"{states}\n{kit.logs()}"
    assert len(list((tmp_path / "annotate" / "annotated").glob("part-*-of-002.jsonl"))) == 2
    assert (tmp_path / "verifyrm" / "best" / "config.json").is_file()
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == ["00-models-tiny-qwen2-policy", "01-models-tiny-qwen2-policy"]
    assert all((p / "results.json").is_file() for p in (tmp_path / "eval").iterdir())
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert "rule" in json.dumps(summary)


def test_rm_training_on_an_annotate_folder_split_otherwise_is_refused_before_the_queue_and_named_in_the_job(kit,
                                                                                                           tmp_path):
    """Annotate ran with SHARDS=2 (a small problem file); RM training is given the default 8. Submitted with `bash`,
    the check refuses it before anything is queued; submitted by plain `sbatch` (no check before the queue), the
    job's merge step fails naming SHARDS=2, not "re-submit the annotate array". With SHARDS=2 and the shards not
    annotated yet, the job says they have not finished (queued, running or failed), the real cause there."""
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question": f"What is {i} + 2?", "reference": str(i + 2)}) + "\n"
                                 for i in range(4)))
    annotated = tmp_path / "annotate"
    kit.sh(["bash", str(LAUNCH / "verifyrm_annotate.sbatch")], {  # its check writes shards/, as before a submission
        "PROMPTS": str(questions), "GENERATORS": kit.models["tiny-qwen2-policy"], "JUDGE": kit.models["tiny-qwen2-policy"],
        "OUT": str(annotated), "SHARDS": "2", "DRY_RUN": "1"})
    train = {"PRETRAIN": kit.models["tiny-qwen2-rm"], "ANNOTATED": str(annotated), "OUT": str(tmp_path / "verifyrm"),
             "RM_TRAIN_BATCH_SIZE": "4", "RM_MICRO_BATCH_SIZE": "2", "EPOCHS": "1", "MAX_LENGTH": "64"}
    queued_before = kit.sh(["squeue", "-h", "-o", "%i"]).stdout.split()
    refused = kit.sh(["bash", str(LAUNCH / "verifyrm_train.sbatch")], train, check=False)
    assert refused.returncode == 2 and "set SHARDS=2" in refused.stderr, refused.stderr
    assert kit.sh(["squeue", "-h", "-o", "%i"]).stdout.split() == queued_before  # nothing submitted

    cpu = ["--gpus-per-node=0", "--cpus-per-task=1", "--mem=1G", "--oversubscribe"]
    other_split = kit.sbatch(cpu, "verifyrm_train.sbatch", train)
    unfinished = kit.sbatch(cpu, "verifyrm_train.sbatch", {**train, "SHARDS": "2", "OUT": str(tmp_path / "verifyrm2")})
    states = kit.wait(other_split, unfinished)
    assert states == {other_split: "FAILED", unfinished: "FAILED"}, states
    log = kit.job_log_tail(other_split)
    assert "SHARDS=8: ANNOTATED=" in log and "set SHARDS=2" in log and "re-submit" not in log, log
    log = kit.job_log_tail(unfinished)
    assert "2 of 2 shards have not finished" in log and "still queued or running" in log, log


# ------------------------------------------------------------------------------ the whole chain
def _job_times(kit: Kit, job: str) -> list[tuple[str, str, str, str]]:
    """(id, state, start, end) of a job and its array tasks, from `scontrol show job`."""
    rows = []
    for line in kit.sh(["scontrol", "-o", "show", "job", job], check=False).stdout.splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        rows.append((fields["JobId"], fields["JobState"], fields["StartTime"], fields["EndTime"]))
    return rows


# Nightly: its links are this file's other tests (each launcher by plain sbatch, USR1 -> checkpoint -> requeue) and
# test_launch_scripts.py's (the chain's afterok order); this runs them as one chain, the longest test of the suite.
@pytest.mark.nightly
def test_reproduce_paper_in_cpu_mode_runs_from_data_to_report_with_a_requeued_two_node_arm(kit, tmp_path):
    """annotate (array) -> VerifyRM training -> the cooper arm on both nodes -> evaluation (array) and report,
    chained by afterok (one arm: two arms' 2-node Ray clusters starting at once overload 2 cores; the fake-sbatch
    test in test_launch_scripts.py checks that evaluation and report wait for every arm).

    The arm gets USR1, what Slurm sends SIGNAL_MARGIN before the time limit (--signal=B:USR1@600), at a chosen
    moment of its checkpoint saves rather than at a time: at step 2, after the policy's save and before the RM's
    (step 1 saved both twice: its scheduled and its best save), sent by the job itself (`PREEMPT_HOOK`). It
    requeues itself (scontrol requeue) and keeps its id; the next attempt resumes from the newest step both models
    hold whole, step 1, says so in one line naming the cut save, and goes on at step 2; evaluation and report wait
    for that final completion. A job of the chain that fails ends the test at once, with its log."""
    policy, rm = kit.models["tiny-qwen2-policy"], kit.models["tiny-qwen2-rm"]
    raw = tmp_path / "train.jsonl"
    raw.write_text("".join(json.dumps({"question": f"What is {i} + {i + 1}?", "answer": f"#### {2 * i + 1}"}) + "\n"
                           for i in range(12)))
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question": f"What is {i} + 2?", "reference": str(i + 2)}) + "\n"
                                 for i in range(4)))
    work = tmp_path / "work"
    env = {"WORKDIR": str(work), "POLICY": policy, "ASSISTANT_MODEL": "policy", "PROMPTS": str(raw), "HELDOUT": "4",
           "DATA_DIR": _benchmarks(tmp_path / "bench"), "BENCHMARKS": "gsm8k", "LIMIT": "2", "PROTOCOL": "greedy",
           "PRETRAIN": rm, "INIT_HEAD": "0", "GENERATORS": f"{policy},{kit.judge}", "JUDGE": kit.judge, "ANNOTATE_PROMPTS": str(questions),
           "SHARDS": "2", "SAMPLES_PER_QUESTION": "2", "GEN_MAX_NEW_TOKENS": "24", "ANNOTATE_VERIFIER_WORKERS": "1",
           "RM_TRAIN_BATCH_SIZE": "4", "RM_MICRO_BATCH_SIZE": "2", "EPOCHS": "1", "MAX_LENGTH": "64",
           "ARMS": "cooper", "NODES": "2", "EVAL_STEPS": "1", **TINY_RL, "NUM_EPISODES": "2",  # 4 steps
           "SBATCH_ARGS": f"--output={tmp_path}/slurm-%x-%A_%a.log"}
    hook = tmp_path / "preempt_hook.sh"
    hook.write_text(PREEMPT_HOOK)
    hook.chmod(0o755)
    fired = tmp_path / "preempted"
    # The save held there cannot meet the job's request for a checkpoint: it waits 5 s, then requeues anyway.
    env.update({"COOPER_SAVE_MOMENT_HOOK": str(hook), "PREEMPT_AT": "before_rm_save:global_step2",
                "PREEMPT_FIRED": str(fired), "SAVE_ON_SIGNAL_S": "5"})
    result = kit.sh(["bash", str(LAUNCH / "reproduce_paper.sh")], env, timeout=600)
    jobs = re.findall(r"^(\d+)$", result.stderr, flags=re.MULTILINE)
    assert len(jobs) == 5, result.stderr  # annotate, train, the arm, evaluate, report
    annotate, train, cooper, evaluate, report = jobs
    out = work / "rl-cooper"
    states = kit.wait(*jobs, timeout=4 * JOB_TIMEOUT_S, chain=True)
    assert fired.read_text().split() == ["before_rm_save", "global_step2", "job", cooper], "the preemption landed"
    # annotate: 2 shards; train; the arm; evaluate: the base policy and the arm; report
    assert set(states.values()) == {"COMPLETED"} and len(states) == 2 + 1 + 1 + 2 + 1, f"{states}\n{kit.logs()}"
    times = {job: _job_times(kit, job) for job in jobs}
    start = {job: min(row[2] for row in rows) for job, rows in times.items()}
    end = {job: max(row[3] for row in rows) for job, rows in times.items()}
    assert end[annotate] <= start[train] <= end[train] <= start[cooper]
    assert end[cooper] <= min(start[evaluate], start[report])  # the final attempt's end

    # The requeued arm: two attempts of one job, the second resumed from the checkpoint, on both nodes.
    attempts = launch_record(out)["attempts"]
    assert [a["restart_count"] for a in attempts] == [0, 1] and {a["job_id"] for a in attempts} == {cooper}
    assert attempts[0]["exit"] != 0 and attempts[1]["exit"] == 0
    # The first attempt's last lines may be lost with it (Ray forwards a worker's log asynchronously).
    first, second = attempts_steps(out / "logs" / "job.log")
    assert first in ([1], [1, 2]) and second == [2, 3, 4], f"the steps of each attempt: {first}, {second}"
    resumed = re.findall(r"resuming at step .*", (out / "logs" / "job.log").read_text(errors="replace"))
    assert len(resumed) == 1 and re.fullmatch(
        r"resuming at step 1 from the policy's (best_)?global_step1 and the RM's (best_)?global_step1: the save of "
        r"global_step2 was cut \(the policy's `latest` named global_step2, the RM's (best_)?global_step1\)",
        resumed[0]), resumed
    slurm_log = kit.logs(tail=None)  # the first attempt's output, kept by --open-mode=append
    assert "USR1: no checkpoint within 5 s; the next attempt resumes from the last whole one" in slurm_log
    assert "requeueing job" in slurm_log
    assert (out / "logs" / "ray-n1.log").is_file() and (out / "logs" / "ray-n2.log").is_file()
    last = attempts[-1]
    assert last["nodes"] == "n[1-2]" and "--ckpt.load_enable" in last["command"]
    assert last["env"]["ARM"] == "cooper" and last["env"]["GPUS_PER_NODE"] == "0"
    info = json.loads((out / "run_info.json").read_text())
    assert (info["arm"], info["status"]) == ("cooper", "done")
    assert (out / "final" / "rm" / "config.json").is_file(), "the co-trained RM export"
    held_out = scalars(out).get("eval/accuracy")
    assert held_out, "a held-out evaluation was logged"

    # The report names the arm as a lab run does; the base policy and the arm's final policy were evaluated.
    assert "cooper" in json.dumps(json.loads((work / "report" / "summary.json").read_text()))
    assert (work / "report" / "report.md").is_file()
    assert len(list((work / "eval").glob("*/results.json"))) == 2
    assert job_processes(cooper) == [] and cluster_processes(ray_port(kit, cooper)) == [], "a process of the job outlived it"
