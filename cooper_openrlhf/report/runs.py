"""Reading one training run from disk: its identity, tensorboard scalars and rollout logs.

A run folder (RUN_DIR) is whatever a training launch wrote into; its tensorboard scalars and rollouts.jsonl are
read as ray/run_logs.py reads them (found recursively, named as the trainer logs them, the newest write of a step
winning), and pairs.jsonl beside the rollout log is counted here.

Arm and seed: `run_info.json` in RUN_DIR (`{"arm": ..., "seed": ...}`, as the lab writes it), else the
folder name `<arm>_seed<k>`, else the folder name as the arm and seed 0. A run_info.json with
`"status": "failed"` (the lab's record of a run that exited non-zero) makes the run a failed one, named
with its exit status and log, whatever it logged before failing.

Runs logged before the trainer logged `cooper/rm_reward_wrong_mean` / `_correct_mean` (what the RM paid
verified-wrong / -correct rollouts; the hacking rule wrong_paid_more and the report read them) get them from their rollout
log (`scalars_with_verdict_rewards`), whose `reward` is the RM's at every step that logged
`cooper/rm_reward_mean` and did not pay by the rule (`cooper/reward_from_rule`).
"""

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cooper_openrlhf.algo.hacking_stats import rm_reward_by_verdict
from cooper_openrlhf.algo.metric_keys import REWARD_FROM_RULE, RM_REWARD, WRONG_REWARD
from cooper_openrlhf.ray.run_logs import Series, event_dirs, iter_rollouts, read_scalars
from cooper_openrlhf.report.rollouts import style_series

RUN_INFO = "run_info.json"
_SEED_NAME = re.compile(r"^(?P<arm>.+)_seed(?P<seed>\d+)$")


@dataclass
class RolloutLog:
    """What a run's rollouts.jsonl / pairs.jsonl say, streamed (the files can be large)."""

    path: str
    steps: int = 0  # distinct steps logged
    rollouts: int = 0
    verified: int = 0  # rollouts the rule verifier marked correct
    rewarded_unverified: int = 0  # rollouts with reward >= 0.5 that the verifier did not mark correct
    last_step: int | None = None
    last_step_rows: list[dict] = field(default_factory=list)  # every rollout of the last step
    pairs: int = 0
    valid_pairs: int = 0


@dataclass
class RunData:
    """One run: who it is, where it is, what it logged (or why it could not be read)."""

    path: str
    arm: str
    seed: int
    scalars: dict[str, Series] = field(default_factory=dict)
    rollouts: RolloutLog | None = None
    error: str | None = None  # set for a failed run: nothing to plot

    @property
    def failed(self) -> bool:
        return self.error is not None


def run_identity(run_dir: Path) -> tuple[str, int]:
    """(arm, seed) of a run folder (module docstring); a malformed run_info.json raises naming the file."""
    info_path = run_dir / RUN_INFO
    if info_path.is_file():
        try:
            info = json.loads(info_path.read_text(encoding="utf-8"))
            return str(info["arm"]), int(info.get("seed", 0))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{info_path}: expected {{\"arm\": str, \"seed\": int}}, got an unreadable file ({exc})") from None
    match = _SEED_NAME.match(run_dir.name)
    if match:
        return match["arm"], int(match["seed"])
    return run_dir.name, 0


def scalars_with_verdict_rewards(scalars: dict[str, Series], rollout_rows: Iterable[dict]) -> dict[str, Series]:
    """`scalars` with the RM's mean reward on verified-wrong / -correct rollouts per step (`rm_reward_by_verdict`)
    added from the rollout log's rows (`iter_rollouts`) where the run did not log them itself:
    only at steps the RM scored and paid (module docstring). Logged values are never replaced."""
    if WRONG_REWARD in scalars:
        return scalars
    rm_steps = {step for step, _ in scalars.get(RM_REWARD, [])}
    rule_paid = {step for step, value in scalars.get(REWARD_FROM_RULE, []) if value}
    by_step: dict[int, tuple[list[bool], list[float]]] = {}
    for row in rollout_rows:
        if row["step"] in rm_steps - rule_paid and row["reward"] is not None:
            verified, rewards = by_step.setdefault(row["step"], ([], []))
            verified.append(row["verified"])
            rewards.append(row["reward"])
    added: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(by_step):
        for name, value in rm_reward_by_verdict(*by_step[step]).items():
            added.setdefault(f"cooper/{name}", []).append((step, value))
    return {**scalars, **added}


def read_rollout_log(run_dir: Path) -> RolloutLog | None:
    """Counts over the run's rollouts.jsonl (and pairs.jsonl beside it), or None without one."""
    found = sorted(run_dir.rglob("rollouts.jsonl"))
    if not found:
        return None
    log = RolloutLog(path=str(found[0]))
    steps = set()
    for row in iter_rollouts(found[0]):
        step, verified, reward = row["step"], row["verified"], row["reward"]
        steps.add(step)
        log.rollouts += 1
        log.verified += verified
        log.rewarded_unverified += reward >= 0.5 and not verified
        if log.last_step is None or step > log.last_step:
            log.last_step, log.last_step_rows = step, []
        if step == log.last_step:
            log.last_step_rows.append(row)
    log.steps = len(steps)
    pairs = found[0].parent / "pairs.jsonl"
    if pairs.is_file():
        with open(pairs, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    log.pairs += 1
                    log.valid_pairs += bool(json.loads(line).get("valid"))
    return log


def load_run(run_dir: str | Path, style: str | None = None) -> RunData:
    """One run folder -> RunData; a folder without event files (or without scalars) is a failed run, not an error.
    style: the lab's answer sentence S, whose per-step share and exploit rate (report/rollouts.py `style_series`)
    join the scalars when the run has a rollout log."""
    path = Path(run_dir)
    if not path.is_dir():
        return RunData(str(path), path.name, 0, error="not a folder")
    arm, seed = run_identity(path)
    run = RunData(str(path), arm, seed, rollouts=read_rollout_log(path))
    info = json.loads((path / RUN_INFO).read_text(encoding="utf-8")) if (path / RUN_INFO).is_file() else {}
    if info.get("status") == "failed":  # the lab's record: the run's partial logs are not a result
        run.error = f"exit status {info.get('exit')}; log: {info.get('log', path)}"
        return run
    if not event_dirs(path):
        run.error = "no tensorboard event files (was --logger.tensorboard_dir set, and did the run start?)"
        return run
    run.scalars = read_scalars(path)
    if run.rollouts is not None:
        run.scalars = scalars_with_verdict_rewards(run.scalars, iter_rollouts(Path(run.rollouts.path)))
        if style is not None and run.scalars:
            run.scalars.update(style_series(iter_rollouts(Path(run.rollouts.path)), style))
    if not run.scalars:
        run.error = "event files hold no scalars (the run stopped before its first logged step)"
    return run
