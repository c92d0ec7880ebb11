"""Which checkpoints a resumed Cooper run loads: the newest step the policy and the RM both hold whole.

OpenRLHF saves the policy under {ckpt.path}/_actor/<tag> with DeepSpeed, whose `latest` file names the last tag
saved completely (DeepSpeed writes it after the tag's files); `--ckpt.load_enable` loads that tag. Tags are
`global_stepN` (a --ckpt.save_steps save) and `best_global_stepN` (`PPOTrainer.save_best_checkpoint`: step N's
evaluation was the best so far; saved after step N's scheduled save, and N need not be a save step). The RM saves
under _rm with the policy's tag after it (`ray/checkpoints.py`).

Two `latest` files cannot say that a step's two saves are both whole: a preemption between them leaves each naming
another step. So the two saves are one unit: once both returned, the trainer writes {ckpt.path}/whole_pairs/<tag>
(`mark_pair_whole`), and removes it before saving under that tag again (`unmark_pair`). A resume takes the newest
marked tag whose folders both still exist (`resume_point`), or the tag both `latest` files name when that is
newer, whatever moment the last save was cut at, and points both `latest` files at it before the models load
(`point_latest_at`). A run folder from before the markers (none there) is judged by its `latest` files alone:
DeepSpeed writes them last and saves go in step order, so the model whose `latest` is older was cut, and both hold
that older tag whole.

Pure file reading and writing, no Ray or torch: the trainer and train_cooper's driver resume by it, and the
launchers' preflight (`cluster/launch_record.check_last_checkpoint`) judges a run folder by the same function.
"""

import os
import re
from dataclasses import dataclass

POLICY_DIR = "_actor"  # OpenRLHF's, under --ckpt.path
RM_DIR = "_rm"  # the Cooper RM's, beside it
WHOLE_PAIRS_DIR = "whole_pairs"  # one empty file per tag both models saved whole, beside them

_TAG_STEP = re.compile(r"(?:best_)?global_step(\d+)")


class NoWholeCheckpoint(ValueError):
    """The run folder holds checkpoints, but no step both models saved whole."""


@dataclass(frozen=True)
class ResumePoint:
    """Where `--ckpt.load_enable` resumes: `policy_tag` under _actor (None: nothing saved, a fresh start) and
    `rm_tag` under _rm (None without an RM folder: the static and rule arms); `cut`, the newest save found
    unfinished (None when the last save is whole); `latest`, what each model's `latest` file named (None: none)."""

    policy_tag: str | None
    rm_tag: str | None
    cut: str | None = None
    latest: tuple[str | None, str | None] = (None, None)

    @property
    def step(self) -> int | str | None:
        return None if self.policy_tag is None else tag_step(self.policy_tag)

    def describe(self) -> str:
        """The one line a resume logs: the step resumed and the save that was cut."""
        models = f"the policy's {self.policy_tag}" + (f" and the RM's {self.rm_tag}" if self.rm_tag else "")
        line = f"resuming at step {self.step} from {models}"
        if self.cut:
            line += (f": the save of {self.cut} was cut (the policy's `latest` named {self.latest[0] or 'nothing'}, "
                     f"the RM's {self.latest[1] or 'nothing'})")
        return line


def latest_tag(model_dir: str) -> str | None:
    """The tag DeepSpeed's `load_checkpoint` loads from `model_dir` (its `latest` file), or None without one (an
    empty file: DeepSpeed was cut while writing it)."""
    path = os.path.join(model_dir, "latest")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip() or None


def tag_step(tag: str) -> int | str:
    """The rollout step a checkpoint tag holds (any other tag stands for itself)."""
    match = _TAG_STEP.fullmatch(tag)
    return int(match.group(1)) if match else tag


def save_order(tag: str) -> tuple[int, int]:
    """Sorts tags in the order a run saves them: by step, a step's best save after its scheduled one."""
    step = tag_step(tag)
    return (step if isinstance(step, int) else -1, int(tag.startswith("best_")))


def _tags(model_dir: str) -> list[str]:
    if not os.path.isdir(model_dir):
        return []
    return [name for name in os.listdir(model_dir)
            if _TAG_STEP.fullmatch(name) and os.path.isdir(os.path.join(model_dir, name))]


def mark_pair_whole(ckpt_path: str, tag: str) -> None:
    """After the policy's and the RM's saves under `tag` both returned: the pair is whole. Markers of tags the
    rotation has since removed go."""
    folder = os.path.join(ckpt_path, WHOLE_PAIRS_DIR)
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, tag), "w").close()  # creating an empty file is one step: never half written
    for stale in set(os.listdir(folder)) - set(_tags(os.path.join(ckpt_path, POLICY_DIR))):
        os.remove(os.path.join(folder, stale))


def unmark_pair(ckpt_path: str, tag: str) -> None:
    """Before saving under `tag`: the saves overwrite its folders, so until both return it is no whole pair. The
    markers' folder exists from the first save on: it says the run saves pairs even before the RM's first save."""
    folder = os.path.join(ckpt_path, WHOLE_PAIRS_DIR)
    os.makedirs(folder, exist_ok=True)
    if os.path.exists(os.path.join(folder, tag)):
        os.remove(os.path.join(folder, tag))


def _marked_pairs(ckpt_path: str) -> list[str] | None:
    """Marked tags whose folders both still exist, in save order; None for a folder from before the markers."""
    folder = os.path.join(ckpt_path, WHOLE_PAIRS_DIR)
    if not os.path.isdir(folder):
        return None
    held = set(_tags(os.path.join(ckpt_path, POLICY_DIR))) & set(_tags(os.path.join(ckpt_path, RM_DIR)))
    return sorted(held & set(os.listdir(folder)), key=save_order)


def _unmarked_pair(policy: str, rm: str, ckpt_path: str) -> tuple[str, str]:
    """A folder from before the markers: the pair at the older of the two `latest` steps (the model whose `latest`
    is newer saved that step before it, whole), under the older one's tag where the other holds it."""
    if tag_step(policy) == tag_step(rm):
        return policy, rm
    older, newer_dir = (policy, RM_DIR) if save_order(policy) < save_order(rm) else (rm, POLICY_DIR)
    same_step = sorted((t for t in _tags(os.path.join(ckpt_path, newer_dir)) if tag_step(t) == tag_step(older)),
                       key=lambda t: (t != older, save_order(t)))
    if not same_step:
        raise NoWholeCheckpoint(f"the policy's last checkpoint is {policy} but the RM's is {rm}, and "
                                f"{os.path.join(ckpt_path, newer_dir)} holds no checkpoint of step {tag_step(older)}")
    return (older, same_step[0]) if newer_dir == RM_DIR else (same_step[0], older)


def resume_point(ckpt_path: str) -> ResumePoint:
    """Where `--ckpt.load_enable` resumes under `ckpt_path` (module docstring): the newest of the marked pairs and
    of the tags both `latest` files name (each model's last finished save: the same step in both is whole in both,
    as after a cut before the marker). Raises NoWholeCheckpoint when checkpoints exist but no step is whole in both."""
    policy_dir, rm_dir = os.path.join(ckpt_path, POLICY_DIR), os.path.join(ckpt_path, RM_DIR)
    latest = (latest_tag(policy_dir), latest_tag(rm_dir))
    marked = _marked_pairs(ckpt_path)
    if marked is None and not os.path.isdir(rm_dir):  # no RM saves: the policy's `latest` is its whole last save
        return ResumePoint(latest[0], None, latest=latest)
    pairs = [(tag, tag) for tag in marked or []]
    # A folder from before the markers may pair a policy's best_global_stepN with the RM's global_stepN: the same
    # RM (no update runs between a step's scheduled and best saves), saved before the RM kept best tags.
    if None not in latest and (latest[0] == latest[1] or marked is None and tag_step(latest[0]) == tag_step(latest[1])):
        pairs.append(latest)
    if not pairs and marked is None and None not in latest:  # a folder from before the markers
        pairs.append(_unmarked_pair(*latest, ckpt_path))
    if not pairs:
        if not (_tags(policy_dir) or _tags(rm_dir)):
            return ResumePoint(None, None)  # nothing saved yet
        raise NoWholeCheckpoint(f"no tag both models saved whole (the policy's `latest` names {latest[0] or 'none'}, "
                                f"the RM's {latest[1] or 'none'}; {os.path.join(ckpt_path, WHOLE_PAIRS_DIR)} names "
                                "none both still hold)")
    policy_tag, rm_tag = max(pairs, key=lambda pair: save_order(pair[0]))
    newer = [t for t in {*_tags(policy_dir), *_tags(rm_dir), *filter(None, latest)}
             if save_order(t) > save_order(policy_tag)]
    return ResumePoint(policy_tag, rm_tag, max(newer, key=save_order) if newer else None, latest)


def point_latest_at(ckpt_path: str, point: ResumePoint) -> list[str]:
    """Point each model's `latest` at its resume tag (DeepSpeed loads what `latest` names); returns the files
    rewritten. Written beside and renamed over, so a kill here leaves the old file or the new one."""
    rewritten = []
    for model, tag in ((POLICY_DIR, point.policy_tag), (RM_DIR, point.rm_tag)):
        path = os.path.join(ckpt_path, model, "latest")
        if tag is None or latest_tag(os.path.dirname(path)) == tag:
            continue
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(tag)
        os.replace(path + ".tmp", path)
        rewritten.append(path)
    return rewritten
