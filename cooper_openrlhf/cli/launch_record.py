"""What a launcher ran, attempt by attempt: OUT/launch.json, and for RL runs OUT/run_info.json.

launch.json: {"stage", "configuration" (the command minus per-attempt words: what the checkpoints in OUT/ckpt
were written by; `preflight.check_resumable` compares it), "attempts": [{"job_id", "array_task", "restart_count",
"nodes", "started", "ended", "exit", "command", "runtime_env", "env"}]}. A job that Slurm requeues (time limit,
preemption, `scontrol requeue`) keeps its job id and adds an attempt with the next restart count; a resubmission
adds one with a new job id. "env" holds the launcher variables the check read (their values as resolved), never
the whole environment, with every secret (a key or token in a flag, a URL or a variable) shown as *** (runtime.secrets).

run_info.json: {"arm", "seed", "status": "running" | "done" | "failed", "exit", "job_id", "log"}, the fields the
lab writes (`lab/runner.py`) and `report/runs.py` reads, so `cli.report` names a cluster run's arm as a lab's.
"""

import json
import os
import time

from cooper_openrlhf.cluster.checks import Env
from cooper_openrlhf.cli.launch_plans import LAUNCH_RECORD, Plan, run_configuration
from cooper_openrlhf.runtime.secrets import redact_argv, redact_env

RUN_INFO = "run_info.json"  # the name report/runs.py reads
_SLURM_IDS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT", "SLURM_JOB_NODELIST")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return {}


def _write(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
    os.replace(tmp, path)


def record_attempt(path: str, plan: Plan, command: list[str], env: Env) -> None:
    """Append this job's attempt to `path` (launch.json); for an RL plan also mark OUT/run_info.json running."""
    record = _read(path)
    record["stage"] = plan.stage
    if plan.stage == "rl":
        record["configuration"] = run_configuration(command)
    values = env.values
    attempt = {
        "job_id": values.get("SLURM_JOB_ID"), "array_task": values.get("SLURM_ARRAY_TASK_ID"),
        "restart_count": int(values.get("SLURM_RESTART_COUNT") or 0), "nodes": values.get("SLURM_JOB_NODELIST"),
        "started": _now(), "ended": None, "exit": None, "command": redact_argv(command, values),
        "runtime_env": _redacted_runtime_env(plan.runtime_env),
        "env": redact_env({name: values[name] for name in sorted(env.read | set(_SLURM_IDS)) if name in values}),
    }
    if plan.placement is not None:
        attempt["placement"] = plan.placement.describe()
    record.setdefault("attempts", []).append(attempt)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _write(path, record)
    if plan.stage == "rl":
        out = os.path.dirname(os.path.abspath(path))
        _write(os.path.join(out, RUN_INFO), {
            "arm": env.get("ARM", "cooper"), "seed": int(env.get("SEED", "42")), "status": "running", "exit": None,
            "job_id": values.get("SLURM_JOB_ID"), "log": os.path.join(out, "logs", "job.log")})


def _redacted_runtime_env(runtime_env: dict | None) -> dict | None:
    if not runtime_env or "env_vars" not in runtime_env:
        return runtime_env
    return {**runtime_env, "env_vars": redact_env(runtime_env["env_vars"])}


def record_end(out: str, status: int) -> None:
    """How the last attempt ended: launch.json's attempt and run_info.json's status ("done" on 0, else "failed")."""
    path = os.path.join(out, LAUNCH_RECORD)
    record = _read(path)
    if record.get("attempts"):
        record["attempts"][-1].update(ended=_now(), exit=status)
        _write(path, record)
    info_path = os.path.join(out, RUN_INFO)
    info = _read(info_path)
    if info:
        info.update(status="done" if status == 0 else "failed", exit=status)
        _write(info_path, info)
