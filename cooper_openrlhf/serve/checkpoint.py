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
OpenRLHF's own rotation (`max_num`) deletes before it writes, so it is turned off here. Every `.saving-*` folder is
removed before a save starts and the save's own when it fails (a full disk, say), so failed attempts never pile up.

Weights that are not finite (NaN or inf, in any dtype) are never saved nor exported: `save` and `export` refuse
them (`NonFiniteWeights`) before writing anything, the engine's and every pinned version's alike; the learner never
publishes them either (`serve/learner.py`).

Version numbers are never reused for other weights. A version is published before the checkpoint that holds it
is written, so a kill -9 in between loses weights that trainers were already paid by. `published_version` (beside
the checkpoints) holds the highest version number ever published, written and flushed before the version is
published (`next_version`); a restart whose checkpoint is older serves the checkpoint's weights under their own
number and publishes its next version past every lost one (`never_reuse_versions` wires a scorer).

The export is the VerifyRM format (`rm.export.export_rm`) that `train_cooper --reward.model_name_or_path` and
`evaluate` read.
"""

import logging
import math
import os
import re
import shutil
from dataclasses import dataclass, field

import torch

from cooper_openrlhf.rm.export import export_rm
from cooper_openrlhf.rm.pairwise_update import RMTrainer
from cooper_openrlhf.rm.snapshot import weights_finite

logger = logging.getLogger(__name__)

STATE_KEY = "cooper_service"
VERSION_LOG = "published_version"  # the highest RM version number ever published from this state dir
COUNTERS_KEY = "cooper_rm_counters"  # as the RM actor names them (ray/reward_actor.py)
PINNED_FILE = "pinned_versions.pt"
SAVING_PREFIX = ".saving-"
TAG = re.compile(r"version(\d+)(?:\.(\d+))?")


class NonFiniteWeights(ValueError):
    """Weights with NaN or inf entries: never saved, exported or published."""


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
        self._published = 0  # the highest version published by this process (the log may not have been writable)

    def save(self, state: dict, pinned_models: dict | None = None) -> str:
        """Commit the RM's DeepSpeed state, `state` (the service's) and `pinned_models` ({version: module} of the
        older versions open groups need) as a new checkpoint; returns its tag. See the module docstring."""
        refuse_non_finite(self.trainer.model.module, f"the RM of version {state['version']}")
        for version, module in (pinned_models or {}).items():
            refuse_non_finite(module, f"the pinned RM version {version}")
        os.makedirs(self.dir, exist_ok=True)
        tag = self._free_tag(state["version"])
        saving = os.path.join(self.dir, SAVING_PREFIX + tag)
        self._remove_interrupted_saves()
        try:
            self.trainer.strategy.save_ckpt(self.trainer.model, self.dir, SAVING_PREFIX + tag, max_num=math.inf,
                                            max_mem=math.inf, save_latest=False,
                                            client_state={STATE_KEY: state, COUNTERS_KEY: dict(self.trainer.counters)})
            torch.save({version: {k: v.detach().cpu() for k, v in module.state_dict().items()}
                        for version, module in (pinned_models or {}).items()}, os.path.join(saving, PINNED_FILE))
            _fsync_tree(saving)
            os.rename(saving, os.path.join(self.dir, tag))
        except BaseException:
            shutil.rmtree(saving, ignore_errors=True)  # what the failed attempt wrote, so attempts never pile up
            raise
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
        for name in [t for t in tags[:-self.keep] if t != live]:
            shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)
        self._remove_interrupted_saves()

    def _remove_interrupted_saves(self) -> None:
        for name in self._entries():
            if name.startswith(SAVING_PREFIX):
                shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)

    # ------------------------------------------------------------------------------ version numbers
    def highest_published(self) -> int:
        """The highest version number ever published from this state dir (0: none yet)."""
        path = os.path.join(self.dir, VERSION_LOG)
        if not os.path.isfile(path):
            return 0
        with open(path, encoding="utf-8") as handle:
            return int(handle.read().strip() or 0)

    def next_version(self, current: int) -> int:
        """The number to publish a new version under: one past `current` and past every version ever published,
        recorded (flushed to disk) before it is returned, so before anyone can be paid by it."""
        version = max(current, self._published, self.highest_published()) + 1
        self._published = version
        try:
            self.record_published(version)
        except OSError as exc:  # a full or read-only disk must not stop learning: checkpoints fail the same way
            logger.warning("the version log in %s could not be written (%s); RM version %d is published anyway. Until "
                           "it can be, a restart may publish a number clients were already paid by", self.dir, exc,
                           version)
        return version

    def record_published(self, version: int) -> None:
        """Note on disk, flushed, that `version` is about to be published (unless a higher one was)."""
        if version <= self.highest_published():
            return
        os.makedirs(self.dir, exist_ok=True)
        fresh = os.path.join(self.dir, VERSION_LOG + ".next")
        with open(fresh, "w", encoding="utf-8") as handle:
            handle.write(f"{version}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(fresh, os.path.join(self.dir, VERSION_LOG))
        _fsync_dir(self.dir)

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
        refuse_non_finite(t.model.module, "the trained RM")
        return str(export_rm(t.model, t.tokenizer, out_dir, template_version=t.template_version,
                             max_length=t.max_length))


def refuse_non_finite(module, what: str) -> None:
    """NonFiniteWeights unless every weight of `module` is finite, whatever its dtype."""
    if not weights_finite(module):
        raise NonFiniteWeights(f"{what} has non-finite weights (NaN or inf): not saved, exported or published")


def never_reuse_versions(scorer, checkpointer: ServiceCheckpoint) -> None:
    """Make `scorer` (an `rm.scorer.RMScorer` resumed from `checkpointer`'s latest checkpoint) publish every new
    version past every version ever published from its state dir, each number recorded before it is published
    (`ServiceCheckpoint.next_version`). The restored weights keep their own number."""
    highest = checkpointer.highest_published()
    if highest > scorer.latest:
        lost = f"RM version {highest} was" if highest == scorer.latest + 1 else \
            f"RM versions {scorer.latest + 1} to {highest} were"
        logger.warning("%s published after the checkpoint of version %d and lost with the process; no number is "
                       "reused: the next version is %d", lost, scorer.latest, highest + 1)
    publish = scorer.publish

    def publish_recorded(trained_module) -> int:
        version = checkpointer.next_version(scorer.latest)
        if version == scorer.latest + 1:  # the number the scorer gives it
            return publish(trained_module)
        scorer.restore(version, trained_module.state_dict())  # past the numbers lost with a killed process
        return version

    scorer.publish = publish_recorded
