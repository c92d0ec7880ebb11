"""The reward service's checkpoints and its final export.

A checkpoint is OpenRLHF's `DeepspeedStrategy.save_ckpt` of the RM engine (model, optimizer, LR schedule) under
`{state_dir}/rm/{tag}`, with the service's own state in the same file's client state: the version V, the counters,
the RM update's counters and the GRPO groups not yet learned from (`RewardService.state`). Beside it,
`pinned_versions.pt` holds the weights of the older RM versions that open groups are pinned to, so a restart can
finish those groups with the version that scored their first samples (`serve/groups.py`).

A save is a commit, so a kill -9 at any moment leaves a loadable checkpoint:
  1. everything is written under a temporary tag (`.saving-{tag}`, never a tag `latest` names), then fsynced;
  2. the temporary tag is renamed to its final name, `version{V}` (`version{V}.{k}` when V was saved before, e.g.
     by the shutdown save after a periodic one: a save never writes into a live checkpoint);
  3. `latest` is replaced atomically (a new file renamed over the old one): this is the moment the new checkpoint
     becomes the one a restart loads;
  4. only then are checkpoints beyond the newest `keep` deleted, and the leftovers of interrupted saves.
OpenRLHF's own rotation (`max_num`) deletes before it writes, so it is turned off here.

The export is the VerifyRM format (`rm.model.export_rm`) that `train_cooper --reward.model_name_or_path` and
`evaluate` read.
"""

import logging
import math
import os
import re
import shutil
from dataclasses import dataclass, field

import torch

from cooper_openrlhf.rm.model import export_rm
from cooper_openrlhf.rm.pairwise_update import RMTrainer

logger = logging.getLogger(__name__)

STATE_KEY = "cooper_service"
COUNTERS_KEY = "cooper_rm_counters"  # as the RM actor names them (ray/reward_actor.py)
PINNED_FILE = "pinned_versions.pt"
SAVING_PREFIX = ".saving-"
TAG = re.compile(r"version(\d+)(?:\.(\d+))?")


@dataclass
class Restored:
    """What a restart gets back besides the engine's own state."""

    tag: str  # the checkpoint loaded (a folder of {state_dir}/rm)
    state: dict  # RewardService.state() as saved
    pinned: dict[int, dict] = field(default_factory=dict)  # older version -> its weights (state dict)


def tag_order(tag: str) -> tuple[int, int] | None:
    """(V, k) of a final tag `version{V}` / `version{V}.{k}` (saving order), None for anything else."""
    match = TAG.fullmatch(tag)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else None


def _fsync_tree(path: str) -> None:
    """Flush a folder's files and the folder entries to disk (a rename is only a commit after the data is)."""
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class ServiceCheckpoint:
    def __init__(self, trainer: RMTrainer, state_dir: str, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (the live checkpoint), got {keep}")
        self.trainer, self.dir, self.keep = trainer, os.path.join(state_dir, "rm"), keep

    def save(self, state: dict, pinned_models: dict | None = None) -> str:
        """Commit the RM's DeepSpeed state, `state` (the service's) and `pinned_models` ({version: module} of the
        older versions open groups need) as a new checkpoint; returns its tag. See the module docstring."""
        os.makedirs(self.dir, exist_ok=True)
        tag = self._free_tag(state["version"])
        saving = SAVING_PREFIX + tag
        shutil.rmtree(os.path.join(self.dir, saving), ignore_errors=True)  # a leftover of an interrupted save
        self.trainer.strategy.save_ckpt(self.trainer.model, self.dir, saving, max_num=math.inf, max_mem=math.inf,
                                        client_state={STATE_KEY: state, COUNTERS_KEY: dict(self.trainer.counters)},
                                        save_latest=False)
        torch.save({version: {k: v.detach().cpu() for k, v in module.state_dict().items()}
                    for version, module in (pinned_models or {}).items()},
                   os.path.join(self.dir, saving, PINNED_FILE))
        _fsync_tree(os.path.join(self.dir, saving))
        os.rename(os.path.join(self.dir, saving), os.path.join(self.dir, tag))
        self._point_latest_to(tag)
        self._prune(tag)
        return tag

    def _free_tag(self, version: int) -> str:
        taken = [order for order in map(tag_order, self._entries()) if order and order[0] == version]
        return f"version{version}" if not taken else f"version{version}.{max(k for _, k in taken) + 1}"

    def _entries(self) -> list[str]:
        return os.listdir(self.dir) if os.path.isdir(self.dir) else []

    def _point_latest_to(self, tag: str) -> None:
        fresh = os.path.join(self.dir, "latest.next")
        with open(fresh, "w", encoding="utf-8") as handle:
            handle.write(tag)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(fresh, os.path.join(self.dir, "latest"))
        _fsync_dir(self.dir)

    def _prune(self, live: str) -> None:
        """Delete the checkpoints beyond the newest `keep` (never the live one) and interrupted saves' leftovers."""
        tags = sorted((t for t in self._entries() if tag_order(t)), key=tag_order)
        old = [t for t in tags[:-self.keep] if t != live]
        old += [t for t in self._entries() if t.startswith(SAVING_PREFIX)]
        for name in old:
            shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)

    def latest_tag(self) -> str | None:
        path = os.path.join(self.dir, "latest")
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()

    def load(self) -> Restored | None:
        """Restore the checkpoint `latest` names into the engine (None: no checkpoint yet)."""
        tag = self.latest_tag()
        if tag is None:
            return None
        load_path, states = self.trainer.strategy.load_ckpt(self.trainer.model, self.dir, tag)
        if load_path is None:
            raise FileNotFoundError(f"{self.dir}/latest names {tag}, which cannot be loaded")
        self.trainer.counters = dict(states.get(COUNTERS_KEY, self.trainer.counters))
        pinned_path = os.path.join(self.dir, tag, PINNED_FILE)
        pinned = torch.load(pinned_path, map_location="cpu") if os.path.isfile(pinned_path) else {}
        state = states[STATE_KEY]
        logger.info("resumed from checkpoint %s (RM version %d%s)", os.path.join(self.dir, tag), state["version"],
                    f"; older versions kept for open groups: {sorted(pinned)}" if pinned else "")
        self._prune(tag)  # leftovers of a save a kill interrupted
        return Restored(tag, state, pinned)

    def export(self, out_dir: str) -> str:
        """The trained RM as a VerifyRM folder."""
        t = self.trainer
        return str(export_rm(t.model, t.tokenizer, out_dir, template_version=t.template_version,
                             max_length=t.max_length))
