"""TrainableRewardModelActor: OpenRLHF's reward-model actor, made trainable for Cooper's RM update.

Stock OpenRLHF scores rollouts with a frozen `RewardModelActor` that reads the policy's token ids. This
actor instead reads text: (question, reference, completion) rendered through the VerifyRM template
(`algo.template`) and tokenised with the RM's own tokenizer (`rm.model`), so the policy's chat formatting
never reaches the RM. It is a `BaseModelActor` fanned out with OpenRLHF's `RayActorGroup`, prepared and
checkpointed with OpenRLHF's `DeepspeedStrategy`; the loss is `algo.losses.pairwise_rm_loss`.

One `fit` call is Cooper's RM update (arXiv 2508.05613, Eq. 5) on one data-parallel rank:
`rm.pairwise_update.pairwise_update`, the same function the reward service (`serve/`) trains with (anchored with
--cooper.rm_anchor_weight). For the RM guard (`ray/rm_guard.py`) each rank holds its training state in memory before
an update (`snapshot`, `rm/snapshot.py`), puts it back when the guard rejects the update (`restore_snapshot`),
says whether its weights are finite and lowers its learning rate (`scale_lr`).
"""

import math
import os
import shutil

import ray
import torch
from openrlhf.trainer.ray.launcher import BaseModelActor
from openrlhf.utils.deepspeed.deepspeed_utils import offload_deepspeed_states, reload_deepspeed_states
from openrlhf.utils.distributed_util import torch_dist_barrier_and_cuda_sync

from cooper_openrlhf.algo.pairs import PairBatch
from cooper_openrlhf.ray.checkpoint_tags import RM_DIR
from cooper_openrlhf.rm.model import (
    DEFAULT_RM_MAX_LENGTH,
    adamw_config,
    load_rm,
    recorded_max_length,
    score_logits,
    usable_max_length,
)
from cooper_openrlhf.rm.export import export_rm
from cooper_openrlhf.rm.pairwise_update import RMTrainer, pairwise_update
from cooper_openrlhf.rm.snapshot import EngineSnapshot, scale_lr, weights_finite

CHECKPOINT_SUBDIR = RM_DIR  # beside OpenRLHF's "_actor" under --ckpt.path
COUNTERS_KEY = "cooper_rm_counters"  # in the DeepSpeed checkpoint's client state


def rm_optimizer_config(cooper, scheduler_steps: int) -> dict:
    """The `strategy.prepare((model, cfg))` dict of the RM: `rm.model.adamw_config` from `--cooper.rm_*`."""
    return adamw_config(lr=cooper.rm_lr, weight_decay=cooper.rm_weight_decay, lr_scheduler=cooper.rm_lr_scheduler,
                        warmup_ratio=cooper.rm_warmup_ratio, max_norm=cooper.rm_max_norm,
                        scheduler_steps=scheduler_steps)


def rm_schedule_steps(cooper, rollout_steps: int, prompts_per_step: int) -> int:
    """RM optimizer steps of a run: per rollout step, `rm_updates_per_step` passes of one step each
    (granularity "step") or of one step per mini-batch of the step's pairs (at most one pair per prompt,
    so at most ceil(prompts / rm_mini_batch_size) mini-batches; steps with fewer pairs end the schedule early)."""
    per_pass = 1
    if cooper.rm_update_granularity == "minibatch":
        per_pass = math.ceil(prompts_per_step / cooper.rm_mini_batch_size)
    return rollout_steps * cooper.rm_updates_per_step * per_pass


MOMENT_CHUNK = 1 << 22  # elements per float64 slice in `weight_moments`: 32 MB (and its square), whatever the RM


@torch.no_grad()
def weight_moments(weights, chunk: int | None = None) -> torch.Tensor:
    """(2,) float64 [sum, sum of squares] of every element of `weights`, on their device, accumulated in float64
    over slices of at most `chunk` elements: whole-weight float64 copies (`w.double().square()`: two of them, 8 bytes
    per element each) of the largest matrix would take 3.7 GB for a 1.5B RM's 151,936 x 1,536 embedding after
    every RM update. Every rank sums in the same order, so ranks holding the same weights get bit-identical
    results. chunk: default MOMENT_CHUNK."""
    chunk = chunk or MOMENT_CHUNK
    total = None
    for weight in weights:
        flat = weight.reshape(-1)
        if total is None:
            total = torch.zeros(2, dtype=torch.float64, device=flat.device)
        for start in range(0, flat.numel(), chunk):
            part = flat[start : start + chunk].double()
            total[0] += part.sum()
            total[1] += part.square().sum()
    return total if total is not None else torch.zeros(2, dtype=torch.float64, device="cpu")


def stale_rm_checkpoints(rm_dir: str, policy_dir: str) -> list[str]:
    """Tags of checkpoint folders under `rm_dir` with no policy checkpoint of the same tag under `policy_dir`."""
    if not os.path.isdir(rm_dir):
        return []
    policy = set(os.listdir(policy_dir)) if os.path.isdir(policy_dir) else set()
    return sorted(tag for tag in os.listdir(rm_dir) if os.path.isdir(os.path.join(rm_dir, tag)) and tag not in policy)


@ray.remote(num_gpus=1)
class TrainableRewardModelActor(BaseModelActor):
    """One data-parallel rank of the Cooper RM (see the module docstring)."""

    def init_model_from_pretrained(self, strategy, rm_path: str, rollout_steps: int, cooper_cfg=None) -> None:
        """Load the RM at `rm_path`; with --remote_rm_trainable give it an optimizer and schedule.

        rollout_steps: rollout steps of the run (`CooperPPOTrainer.get_rollout_steps`), NOT OpenRLHF's max_steps,
            which counts the policy's optimizer steps; the RM's schedule spans `rm_schedule_steps` of them.
        cooper_cfg: the `--cooper.*` namespace (default: strategy.args.cooper).
        """
        args = strategy.args
        self.cooper = cooper_cfg if cooper_cfg is not None else args.cooper
        self.trainable = bool(args.remote_rm_trainable)
        # The RM's own DeepSpeed geometry: its ZeRO stage, and micro-batches of rm_micro_batch_size with
        # gradient_accumulation_steps = 1 (fit() marks the accumulation boundary itself).
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        strategy.stage = self.cooper.rm_zero_stage
        strategy.micro_train_batch_size = self.cooper.rm_micro_batch_size
        strategy.train_batch_size = self.cooper.rm_micro_batch_size * world_size
        self._setup_distributed(strategy)

        from cooper_openrlhf.runtime.dtype import torch_dtype  # the run's --ds.param_dtype, resolved at start-up
        dtype = torch_dtype(args.ds.param_dtype)
        ds_config = strategy.get_ds_train_config() if self.trainable else strategy.get_ds_eval_config()
        model, self.tokenizer, self.template_version = load_rm(
            rm_path, dtype=dtype, attn_implementation=args.ds.attn_implementation, ds_config=ds_config
        )
        requested = self.cooper.rm_max_length or recorded_max_length(model.config) or DEFAULT_RM_MAX_LENGTH
        self.max_length = usable_max_length(model, requested)
        if self.trainable:
            cfg = rm_optimizer_config(self.cooper, rm_schedule_steps(self.cooper, rollout_steps,
                                                                     args.rollout.batch_size))
            self.model, self.optim, self.scheduler = strategy.prepare((model, cfg))
        else:
            model._offload = args.reward.offload
            self.model, self.optim, self.scheduler = strategy.prepare(model), None, None
        self.model.eval()
        self.rm_trainer = RMTrainer(strategy, self.model, self.optim, self.scheduler, self.tokenizer, self.max_length,
                                    self.template_version, self.cooper.rm_micro_batch_size)
        if self.trainable and args.ds.enable_sleep:
            offload_deepspeed_states(self.model)
        strategy.print(f"Cooper RM from {rm_path}: template {self.template_version}, max_length {self.max_length}, "
                       f"trainable {self.trainable}, ZeRO stage {strategy.stage}")

    # ------------------------------------------------------------------------------------ scoring
    @torch.no_grad()
    def score(self, questions: list[str], references: list[str], completions: list[str]) -> list[float]:
        """RM logits of the triples, in order (`rm.model.score_logits`, forwards of --cooper.rm_score_batch_size)."""
        return score_logits(self.model, self.tokenizer, questions, references, completions, max_length=self.max_length,
                            template_version=self.template_version, batch_size=self.cooper.rm_score_batch_size)

    # ----------------------------------------------------------------------------------- training
    def fit(self, pairs: PairBatch, global_valid: int, anchors=(), anchor_weight: float = 0.0) -> dict[str, float]:
        """Cooper's RM update on this rank's share of the step's pairs (`rm.pairwise_update`); metrics are global.

        pairs: this rank's pairs (invalid slots are skipped). global_valid: valid pairs over all ranks.
        With global_valid == 0 nothing is run and no step is taken. anchors, anchor_weight: this rank's share of the
        step's labelled anchor rows and their BCE weight (--cooper.rm_anchor_weight; every rank the same weight).
        """
        if not self.trainable:
            raise RuntimeError("fit() on a reward model loaded without --remote_rm_trainable")
        metrics = pairwise_update(self.rm_trainer, pairs, global_valid, passes=self.cooper.rm_updates_per_step,
                                  anchors=anchors, anchor_weight=anchor_weight)
        if metrics["cooper/rm_updated"]:
            metrics["cooper/rm_rank_weight_spread"] = self.rank_weight_spread()
        return metrics

    # ------------------------------------------------------------------------------- the RM guard
    def snapshot(self) -> None:
        """Hold this rank's training state in memory (before an update the guard will judge)."""
        self._snapshot = EngineSnapshot.take(self.rm_trainer)

    def restore_snapshot(self) -> float:
        """Put back the state `snapshot` held: the update the guard rejected never happened on this rank. Returns the
        optimizer's step count as restored (what the step logs: the count it logged before the guard is gone)."""
        self._snapshot.restore()
        self._snapshot = None
        return float(self.counters["optimizer_steps"])

    def drop_snapshot(self) -> None:
        """The guard kept the update: free the memory the snapshot held until the next update."""
        self._snapshot = None

    def weights_finite(self) -> bool:
        return weights_finite(self.model.module)

    def scale_lr(self, factor: float) -> float:
        """Multiply this rank's RM learning rate by `factor` (checkpointed with the scheduler); the new rate."""
        return scale_lr(self.rm_trainer, factor)

    @property
    def counters(self) -> dict:
        """Optimizer steps, skipped steps and updates so far (checkpointed with the RM)."""
        return self.rm_trainer.counters

    @torch.no_grad()
    def rank_weight_spread(self) -> float:
        """How far the data-parallel ranks' RM weights are apart (0.0 when they agree, as they must: every rank
        applies the same reduced gradient). Compared as (sum, sum of squares) of all weights in float64
        (`weight_moments`), gathered through the strategy; any difference means the ranks trained different models."""
        mine = weight_moments(p.detach() for p in self.model.module.parameters())
        every = self.strategy.all_gather(mine.cpu()).view(-1, 2)
        return float((every - every[0]).abs().max())

    # -------------------------------------------------------------------------------- checkpoints
    def _checkpoint_dir(self) -> str:
        return os.path.join(self.strategy.args.ckpt.path, CHECKPOINT_SUBDIR)

    def save_checkpoint(self, tag: str, client_states: dict | None = None) -> None:
        """Model, optimizer, scheduler and counters under {ckpt.path}/_rm/{tag}.

        The RM does not rotate its checkpoints on its own: the policy's rotate by eval metric, so the RM keeps
        whatever tags the policy kept (`keep_policy_tags`, called after both saved) and a resume always finds
        the RM of the policy checkpoint it loads."""
        args = self.strategy.args
        states = {**(client_states or {}), COUNTERS_KEY: dict(self.counters)}
        if not args.ckpt.disable_ds:
            self.strategy.save_ckpt(self.model, self._checkpoint_dir(), tag, max_num=math.inf, max_mem=math.inf,
                                    client_state=states)
        if args.ckpt.save_hf:
            self.save_model(os.path.join(args.ckpt.path, f"{tag}_rm_hf"))
        torch_dist_barrier_and_cuda_sync()

    def keep_policy_tags(self) -> list[str]:
        """Remove the RM checkpoints whose policy checkpoint ({ckpt.path}/_actor/{tag}) rotation removed; returns
        the removed tags (rank 0 removes; every rank returns the same list)."""
        removed = stale_rm_checkpoints(self._checkpoint_dir(), os.path.join(self.strategy.args.ckpt.path, "_actor"))
        if self.strategy.is_rank_0():
            for tag in removed:
                shutil.rmtree(os.path.join(self._checkpoint_dir(), tag), ignore_errors=True)
        torch_dist_barrier_and_cuda_sync()
        return removed

    def load_checkpoint(self, tag: str | None = None) -> dict:
        """Restore model, optimizer, scheduler and counters from {ckpt.path}/_rm/{tag} ("latest" if None).

        Returns the checkpoint's client states (global_step, ...) plus the restored `cooper_rm_counters`.
        """
        directory = self._checkpoint_dir()
        sleeping = self.strategy.args.ds.enable_sleep
        if sleeping:
            reload_deepspeed_states(self.model)
        load_path, states = self.strategy.load_ckpt(self.model, directory, tag=tag)
        if sleeping:
            offload_deepspeed_states(self.model)
        if load_path is None:
            raise FileNotFoundError(f"no reward-model checkpoint {tag or '(latest)'} under {directory}")
        self.rm_trainer.counters = dict(states.get(COUNTERS_KEY, self.counters))
        keep = ("episode", "global_step", "total_consumed_prompts", COUNTERS_KEY)
        return {key: states[key] for key in keep if key in states}

    def save_model(self, out_dir: str) -> str:
        """Export the RM in the VerifyRM format (`rm.export.export_rm`); every rank must call it."""
        return str(export_rm(self.model, self.tokenizer, out_dir, template_version=self.template_version,
                             max_length=self.max_length))

    # ------------------------------------------------------------------------- colocation (sleep)
    def reload_states(self) -> None:
        reload_deepspeed_states(self.model)

    def offload_states(self) -> None:
        offload_deepspeed_states(self.model)
