"""The reward service's checkpoints and its final export.

A checkpoint is OpenRLHF's `DeepspeedStrategy.save_ckpt` of the RM engine (model, optimizer, LR schedule) under
`{state_dir}/rm/version{V}`, with the service's own state in the same file's client state: the version V, the
counters, the RM update's counters and the GRPO groups not yet learned from (`RewardService.state`). DeepSpeed
writes the tag's files first and its `latest` pointer last, so a kill -9 during a save leaves the previous
checkpoint the one a restart loads. `keep` checkpoints are kept.

The export is the VerifyRM format (`rm.model.export_rm`) that `train_cooper --reward.model_name_or_path` and
`evaluate` read.
"""

import logging
import math
import os

from cooper_openrlhf.rm.model import export_rm
from cooper_openrlhf.rm.pairwise_update import RMTrainer

logger = logging.getLogger(__name__)

STATE_KEY = "cooper_service"
COUNTERS_KEY = "cooper_rm_counters"  # as the RM actor names them (ray/reward_actor.py)


class ServiceCheckpoint:
    def __init__(self, trainer: RMTrainer, state_dir: str, keep: int = 3):
        self.trainer, self.dir, self.keep = trainer, os.path.join(state_dir, "rm"), keep

    def save(self, state: dict) -> str:
        """Save the RM's DeepSpeed state and `state` (the service's) as tag version{V}; returns the tag."""
        tag = f"version{state['version']}"
        self.trainer.strategy.save_ckpt(self.trainer.model, self.dir, tag, max_num=self.keep, max_mem=math.inf,
                                        client_state={STATE_KEY: state, COUNTERS_KEY: dict(self.trainer.counters)})
        return tag

    def load(self) -> dict | None:
        """Restore the latest checkpoint into the engine; returns the service's state (None: no checkpoint yet)."""
        if not os.path.isfile(os.path.join(self.dir, "latest")):
            return None
        load_path, states = self.trainer.strategy.load_ckpt(self.trainer.model, self.dir)
        if load_path is None:
            raise FileNotFoundError(f"{self.dir}/latest names a checkpoint that cannot be loaded")
        self.trainer.counters = dict(states.get(COUNTERS_KEY, self.trainer.counters))
        logger.info("resumed from %s", load_path)
        return states[STATE_KEY]

    def export(self, out_dir: str) -> str:
        """The trained RM as a VerifyRM folder."""
        t = self.trainer
        return str(export_rm(t.model, t.tokenizer, out_dir, template_version=t.template_version,
                             max_length=t.max_length))
