"""The checks every launcher runs before submitting: variables, model folders, data files, output folders.

Launchers are configured by environment variables; every failure raises `PreflightError` whose message
starts with the variable to fix (`PROMPTS=/x.jsonl: row 12 has no field 'answer'`), so a wrong value fails
in seconds on the login node, not after the queue. Paths that an earlier job of the same chain will
produce (`reproduce_paper.sh` lists them in PENDING_PATHS) are accepted when their folder is writable.
"""

import os
import re
import uuid
from collections.abc import Mapping

from cooper_openrlhf.data.rows import RowFormatError, iter_rows


class PreflightError(ValueError):
    """A launcher input that would fail the job; the message names the variable."""


class Env:
    """Read launcher variables from a mapping (os.environ in the CLI, a dict in tests), with named errors."""

    def __init__(self, values: Mapping[str, str]):
        self.values = values
        self.read: set[str] = set()  # every variable asked for: launch.json records their values
        # Inside a job every upstream output must exist: PENDING_PATHS only counts on the submit side.
        pending = "" if values.get("SLURM_JOB_ID") else values.get("PENDING_PATHS", "")
        self.pending = {os.path.abspath(p) for p in pending.split(":") if p}

    def get(self, name: str, default: str | None = None) -> str | None:
        self.read.add(name)
        value = self.values.get(name, "")
        return value if value != "" else default

    def require(self, name: str, what: str) -> str:
        value = self.get(name)
        if value is None:
            raise PreflightError(f"{name} is not set: {what}")
        return value

    def int(self, name: str, default: int | None, minimum: int = 1) -> int | None:
        text = self.get(name)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            raise PreflightError(f"{name}={text!r}: must be an integer") from None
        if value < minimum:
            raise PreflightError(f"{name}={value}: must be >= {minimum}")
        return value

    def float(self, name: str, default: float) -> float:
        text = self.get(name)
        if text is None:
            return default
        try:
            return float(text)
        except ValueError:
            raise PreflightError(f"{name}={text!r}: must be a number") from None

    def flag(self, name: str) -> bool:
        text = self.get(name, "0").lower()
        if text not in ("0", "1", "true", "false", "yes", "no"):
            raise PreflightError(f"{name}={text!r}: must be 0 or 1")
        return text in ("1", "true", "yes")

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.get(name, default)
        if value not in choices:
            raise PreflightError(f"{name}={value!r}: must be one of {', '.join(choices)}")
        return value

    def is_pending(self, path: str) -> bool:
        return os.path.abspath(path) in self.pending


def check_model_dir(env: Env, name: str, path: str) -> None:
    """A Hugging Face model folder (config.json inside); compute nodes are usually offline, so no hub ids."""
    if env.is_pending(path):
        check_writable_dir(name, os.path.dirname(os.path.abspath(path)) or ".")
        return
    if not os.path.isdir(path):
        hint = (" (a hub id? download it first, e.g. `huggingface-cli download ORG/NAME --local-dir DIR`, and "
                "pass DIR: compute nodes are often offline)" if re.fullmatch(r"[\w.-]+/[\w.-]+", path) else "")
        raise PreflightError(f"{name}={path}: model folder does not exist{hint}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise PreflightError(f"{name}={path}: no config.json in the folder; not a Hugging Face model")


def check_writable_dir(name: str, path: str) -> None:
    """Create `path` if needed and prove it writable by writing and removing a file."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".preflight-{uuid.uuid4().hex}")
        with open(probe, "w") as handle:
            handle.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise PreflightError(f"{name}={path}: output folder is not writable ({exc.strerror or exc})") from None


def read_rows(name: str, path: str) -> list[dict]:
    """Rows of a JSON Lines, JSON (list) or Parquet file; unreadable rows raise naming the line."""
    if not os.path.isfile(path):
        raise PreflightError(f"{name}={path}: data file does not exist")
    try:
        return [row for _, _, row in iter_rows(path)]
    except RowFormatError as exc:
        raise PreflightError(f"{name}={exc}") from None


def check_rows_have_keys(name: str, path: str, rows: list[dict], keys: dict[str, str]) -> None:
    """Every row has every key (keys: field -> the variable that names it) with a non-empty value."""
    if not rows:
        raise PreflightError(f"{name}={path}: no rows")
    for index, row in enumerate(rows):
        for key, variable in keys.items():
            value = row.get(key)
            if value is None or (isinstance(value, str) and not value.strip()):
                problem = "has no field" if key not in row else "has an empty field"
                raise PreflightError(f"{name}={path}: row {index + 1} {problem} {key!r} (set by {variable}); "
                                     f"fields present: {sorted(row)}")


# ------------------------------------------------------------------------------- the RL stage's inputs
def cpu_mode(env: Env) -> bool:
    """GPUS_PER_NODE=0: every role on CPU (tiny models; the local Slurm cluster of scripts/local_slurm.sh)."""
    return env.int("GPUS_PER_NODE", 8, minimum=0) == 0


def check_prompts_prepared(prompts: str, rows: list[dict], input_key: str, label_key: str) -> None:
    """PROMPTS rows have the question and a final answer under INPUT_KEY and LABEL_KEY. A common dataset's own file
    (GSM8K's worked "... #### 72" answers, MATH's problem/answer, {question, reference}) is pointed to the one step
    that prepares it, `cluster.prompts`, which reads those keys as they are."""
    from cooper_openrlhf.rm.data import detect_prompt_format

    fmt = detect_prompt_format(rows[0]) if rows and "instruction" not in rows[0] else None
    prepare = (f"prepare it first: cooper prompts --input {prompts} --out prompts.jsonl "
               "(appends the answer-format instruction; writes question and answer), then PROMPTS=prompts.jsonl")
    if fmt == "gsm8k" and label_key == "answer":
        raise PreflightError(f"PROMPTS={prompts}: a GSM8K file (row 1's 'answer' is a worked solution ending "
                             f"'#### ...', not a final answer); {prepare}")
    try:
        check_rows_have_keys("PROMPTS", prompts, rows, {input_key: "INPUT_KEY", label_key: "LABEL_KEY"})
    except PreflightError as exc:
        if fmt is None:
            raise
        raise PreflightError(f"{exc}. The rows are in the {fmt} format: {prepare}") from None


def check_verify_rm(env: Env, path: str) -> None:
    """VERIFY_RM holds a one-logit sequence classifier (the config only: what train_cooper checks at job start)."""
    if env.is_pending(path):
        return
    from cooper_openrlhf.rm.model import NotASequenceClassifierError, check_reward_model

    try:
        check_reward_model(path)
    except NotASequenceClassifierError as exc:
        raise PreflightError(f"VERIFY_RM={path}: not a VerifyRM export: {exc}") from None


def _divisors_up_to(number: int, limit: int) -> list[int]:
    return [d for d in range(1, limit + 1) if number % d == 0]


def check_batch_sizes(env: Env, placement, n: int, rollout_batch: int, rollout_micro: int,
                      train_batch: int, micro: int) -> None:
    """The batch arithmetic OpenRLHF asserts at start-up, with the launcher variable that fixes each failure
    (`placement`: the stage's `cluster.placement.Placement`). The
    actor's GPU count comes from the placement (ACTOR_GPUS, else NODES x GPUS_PER_NODE), so a count that does not
    fit the batch is said to be the placement's, not TRAIN_BATCH_SIZE's alone."""
    actor = placement.actor_gpus
    given = env.get("ACTOR_GPUS")
    source = (f"ACTOR_GPUS={actor}" if given else f"the CPU placement gives the actor {actor} slot(s)" if cpu_mode(env)
              else f"NODES={placement.nodes} x GPUS_PER_NODE={placement.gpus_per_node} gives the actor {actor} GPU(s) "
              f"({placement.describe()})")
    if train_batch % (micro * actor):
        fitting = _divisors_up_to(train_batch // micro, actor) if train_batch % micro == 0 else []
        fixes = [f"ACTOR_GPUS={fitting[-1]}"] if fitting else []
        fixes.append(f"a TRAIN_BATCH_SIZE that is a multiple of MICRO_BATCH_SIZE={micro} x {actor} = {micro * actor}")
        raise PreflightError(f"{source}: TRAIN_BATCH_SIZE={train_batch} must be a multiple of MICRO_BATCH_SIZE={micro} "
                             f"x {actor} actor GPUs (DeepSpeed's gradient accumulation); set {' or '.join(fixes)}")
    if rollout_batch * n % train_batch:
        raise PreflightError(f"TRAIN_BATCH_SIZE={train_batch}: must divide ROLLOUT_BATCH_SIZE={rollout_batch} x "
                             f"N_SAMPLES={n} = {rollout_batch * n} samples of one rollout step")
    # OpenRLHF: "The number of sample batches must be greater than or equal to the effective number of actor
    # processes" (train_ppo_ray.py): every actor rank takes at least one micro-batch of each rollout step.
    batches = rollout_batch * n // rollout_micro
    if batches < actor:
        largest = rollout_batch * n // actor
        raise PreflightError(
            f"ROLLOUT_MICRO_BATCH_SIZE={rollout_micro}: ROLLOUT_BATCH_SIZE={rollout_batch} x N_SAMPLES={n} = "
            f"{rollout_batch * n} samples per rollout step make {batches} micro-batch(es), fewer than the {actor} actor "
            f"GPU(s) ({source}), each of which needs one (OpenRLHF: \"the number of sample batches must be >= the "
            f"effective number of actor processes\"); set ROLLOUT_MICRO_BATCH_SIZE <= {largest}")
