"""What a launcher ran, attempt by attempt (OUT/launch.json, and for RL runs OUT/run_info.json), and whether a run
folder's checkpoints may be resumed by the command about to run.

launch.json: {"stage", "configuration" (the command minus per-attempt words: what the checkpoints in OUT/ckpt
were written by; `check_resumable` compares it), "attempts": [{"job_id", "array_task", "restart_count",
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

from cooper_openrlhf.cluster.checks import Env, PreflightError
from cooper_openrlhf.ray.checkpoint_tags import POLICY_DIR, RM_DIR, NoWholeCheckpoint, ResumePoint, resume_point
from cooper_openrlhf.runtime.secrets import redact_argv, redact_env

LAUNCH_RECORD = "launch.json"
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


def record_attempt(path: str, plan, command: list[str], env: Env) -> None:
    """Append this job's attempt to `path` (launch.json); for an RL plan (`cluster.plan.Plan`) also mark
    OUT/run_info.json running."""
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


# ------------------------------------------------------------------------- resume from checkpoints
# Words of the command that change between attempts of the same run (not its configuration).
_PER_ATTEMPT_FLAGS = ("--logger.wandb.run_name",)


def run_configuration(argv: list[str]) -> list[str]:
    """The command minus what differs between attempts of one run: what a checkpoint must have been written by.
    Secrets are redacted (it is recorded in launch.json): another wandb key is still the same run."""
    words = redact_argv(argv[3:])
    for flag in _PER_ATTEMPT_FLAGS:
        if flag in words:
            index = words.index(flag)
            del words[index:index + 2]
    return words


def _first_difference(old: list[str], new: list[str]) -> str:
    def flags(words):
        table, key = {}, None
        for word in words:
            if word.startswith("--"):
                key = word
                table[key] = ""
            elif key is not None:
                table[key] = (table[key] + " " + word).strip()
        return table

    before, now = flags(old), flags(new)
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            return f"{key}: {before.get(key, '(absent)')!r} then, {now.get(key, '(absent)')!r} now"
    return "the order of the flags"


def check_resumable(out: str, argv: list[str]) -> tuple[list[str], ResumePoint | None]:
    """A run folder with checkpoints is resumed (`--ckpt.load_enable`) only by the configuration that wrote them.
    Returns the checkpoint folders the job will load and where it resumes (none, None for a fresh run)."""
    ckpt = os.path.join(out, "ckpt")
    if not (os.path.isdir(ckpt) and os.listdir(ckpt)):
        return [], None
    record = os.path.join(out, LAUNCH_RECORD)
    try:
        with open(record, encoding="utf-8") as handle:
            before = json.load(handle)["configuration"]
    except (OSError, ValueError, KeyError):
        raise PreflightError(f"OUT={out}: its checkpoint folder {ckpt} has no {LAUNCH_RECORD} saying which "
                             "configuration wrote it; resuming could load another run's state: use a new OUT, or "
                             "remove the folder") from None
    if before != run_configuration(argv):
        raise PreflightError(f"OUT={out}: its checkpoint folder {ckpt} was written by another configuration "
                             f"({_first_difference(before, run_configuration(argv))}); a resumed job would continue "
                             "that run: use a new OUT, or remove the folder to start afresh")
    return check_last_checkpoint(ckpt)


# What DeepSpeed writes per rank into a checkpoint tag folder (a save cut off by a kill leaves some missing).
_CHECKPOINT_FILES = ("mp_rank_00_model_states.pt",)


def check_last_checkpoint(ckpt: str) -> tuple[list[str], ResumePoint]:
    """The checkpoints `--ckpt.load_enable` would load are whole: the newest step the policy and the RM both saved
    whole, chosen as the trainer chooses it (`ray.checkpoint_tags.resume_point`: after a save cut by a preemption,
    the pair before it); refused, naming the folder, when no such pair exists or its files are gone, instead of
    loading half a state or overwriting it. Returns the folders a resumed job loads, and the resume point."""
    out = os.path.dirname(ckpt)
    try:
        point = resume_point(ckpt)
    except NoWholeCheckpoint as exc:
        raise PreflightError(f"OUT={out}: no step of its checkpoints is whole in both models ({exc}); remove the "
                             "folder to start afresh") from None
    loads = []
    for model, tag in ((POLICY_DIR, point.policy_tag), (RM_DIR, point.rm_tag)):
        if tag is None:
            continue
        folder = os.path.join(ckpt, model, tag)
        missing = [name for name in _CHECKPOINT_FILES if not os.path.isfile(os.path.join(folder, name))]
        if not os.path.isdir(folder) or missing:
            raise PreflightError(f"OUT={out}: the checkpoint {folder} it resumes from is damaged "
                                 f"({'missing' if not os.path.isdir(folder) else 'no ' + ', '.join(missing)}); "
                                 "a resumed job would fail to load it. Remove that tag's folders (each model's) to "
                                 "resume from the pair before it, or remove the folder to start afresh")
        loads.append(folder)
    return loads, point
