"""Which checkpoints a resumed Cooper run loads: the policy's last one, and the RM's of the same step.

OpenRLHF saves the policy under {ckpt.path}/_actor/<tag> with DeepSpeed, whose `latest` file names the last tag
saved completely; `--ckpt.load_enable` loads that tag. Tags are `global_stepN` (a --ckpt.save_steps save) and
`best_global_stepN` (`PPOTrainer.save_best_checkpoint`: step N's evaluation was the best so far; `latest` then
names it, and N need not be a save step). The RM saves under _rm with the policy's tag right after it
(`ray/checkpoints.py`), so the RM's `latest` names the policy's tag once both saves are whole.

Pure file reading, no Ray or torch: the trainer resumes by `resume_tags` and the launchers' preflight
(`cluster/launch_record.check_last_checkpoint`) judges a run folder by the same function.
"""

import os
import re

POLICY_DIR = "_actor"  # OpenRLHF's, under --ckpt.path
RM_DIR = "_rm"  # the Cooper RM's, beside it

_TAG_STEP = re.compile(r"(?:best_)?global_step(\d+)")


class CheckpointMismatch(ValueError):
    """The policy's and the RM's last whole checkpoints are of different steps (a save was cut off between them)."""


def latest_tag(model_dir: str) -> str | None:
    """The tag DeepSpeed's `load_checkpoint` loads from `model_dir` (its `latest` file), or None without one."""
    path = os.path.join(model_dir, "latest")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()


def tag_step(tag: str) -> int | str:
    """The rollout step a checkpoint tag holds (any other tag stands for itself)."""
    match = _TAG_STEP.fullmatch(tag)
    return int(match.group(1)) if match else tag


def rm_resume_tag(policy_tag: str, rm_latest: str | None) -> str:
    """The RM checkpoint to resume with the policy checkpoint `policy_tag`: the RM's last whole save, which must be
    of the policy's step. In runs of this package it is the policy's own tag (a best one included); a run saved
    before the RM kept best tags has the same step's `global_stepN`, the same RM (no update runs between a step's
    scheduled save and its best save)."""
    if rm_latest is None or tag_step(rm_latest) != tag_step(policy_tag):
        raise CheckpointMismatch(f"the policy's last checkpoint is {policy_tag} but the RM's is {rm_latest or 'none'}")
    return rm_latest


def resume_tags(ckpt_path: str) -> tuple[str | None, str | None]:
    """(policy tag, RM tag) that `--ckpt.load_enable` resumes from under `ckpt_path`; (None, None) without a policy
    checkpoint, (tag, None) without an RM folder (the static and rule arms). Raises CheckpointMismatch."""
    policy = latest_tag(os.path.join(ckpt_path, POLICY_DIR))
    if policy is None or not os.path.isdir(os.path.join(ckpt_path, RM_DIR)):
        return policy, None
    return policy, rm_resume_tag(policy, latest_tag(os.path.join(ckpt_path, RM_DIR)))
