"""TrainableRewardModelActor: OpenRLHF's reward-model actor, made trainable for Cooper's RM update.

Stock OpenRLHF scores rollouts with a frozen `RewardModelActor` that reads the policy's token ids. This
actor instead reads text: (question, reference, completion) rendered through the VerifyRM template
(`algo.template`) and tokenised with the RM's own tokenizer (`rm.model`), so the policy's chat formatting
never reaches the RM. It is a `BaseModelActor` fanned out with OpenRLHF's `RayActorGroup`, prepared and
checkpointed with OpenRLHF's `DeepspeedStrategy`; the loss is `algo.losses.pairwise_rm_loss`.

One `fit` call is Cooper's RM update (arXiv 2508.05613, Eq. 5) on one data-parallel rank:
- only valid pairs are forwarded; the positive and negative of a pair share one forward;
- the micro-batch loss is scaled by (pairs in it) * world / global_valid, so that after DeepSpeed
  averages gradients over the ranks the step's gradient is that of the masked mean over exactly the
  step's valid pairs, however they are spread across ranks;
- gradient accumulation is driven by hand (`set_gradient_accumulation_boundary`; the RM's DeepSpeed
  config has gradient_accumulation_steps 1, so no loss is rescaled), one optimizer step per pass,
  `--cooper.rm_updates_per_step` passes; every rank runs the same number of backward passes (a rank
  with fewer pairs backs up a zero loss), as ZeRO's gradient reductions are collective;
- a non-finite loss makes that micro-batch's gradients NaN on purpose, so that DeepSpeed's own
  overflow check (ZeRO 1/2, bf16 and fp16) drops the whole accumulated step on every rank, exactly as
  it does for non-finite gradients; skipped steps are counted from the engine (`skipped_steps`).
"""

import math
import os
import shutil
import time

import ray
import torch
from openrlhf.trainer.ray.launcher import BaseModelActor
from openrlhf.utils.deepspeed.deepspeed_utils import offload_deepspeed_states, reload_deepspeed_states
from openrlhf.utils.distributed_util import torch_dist_barrier_and_cuda_sync

from cooper_openrlhf.algo.losses import pairwise_rm_loss
from cooper_openrlhf.algo.pairs import PairBatch
from cooper_openrlhf.algo.selection import FROM_ASSISTANT, FROM_ROLLOUT
from cooper_openrlhf.ray.checkpoint_tags import RM_DIR
from cooper_openrlhf.rm.model import (
    DEFAULT_RM_MAX_LENGTH,
    adamw_config,
    export_rm,
    load_rm,
    recorded_max_length,
    render_and_encode,
    rm_logits,
    score_logits,
    usable_max_length,
)

CHECKPOINT_SUBDIR = RM_DIR  # beside OpenRLHF's "_actor" under --ckpt.path
COUNTERS_KEY = "cooper_rm_counters"  # in the DeepSpeed checkpoint's client state
SOURCES = (FROM_ASSISTANT, FROM_ROLLOUT)  # negative sources whose pair accuracy is reported


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
        self.counters = {"optimizer_steps": 0, "skipped_steps": 0, "updates": 0}
        if self.trainable:
            cfg = rm_optimizer_config(self.cooper, rm_schedule_steps(self.cooper, rollout_steps,
                                                                     args.rollout.batch_size))
            self.model, self.optim, self.scheduler = strategy.prepare((model, cfg))
        else:
            model._offload = args.reward.offload
            self.model, self.optim, self.scheduler = strategy.prepare(model), None, None
        self.model.eval()
        # A zero-loss input for ranks without pairs in a micro-step (keeps ZeRO's collectives aligned).
        self._filler = render_and_encode(self.tokenizer, [""], [""], [""], self.max_length, self.template_version)
        if self.trainable and args.ds.enable_sleep:
            offload_deepspeed_states(self.model)
        strategy.print(f"Cooper RM from {rm_path}: template {self.template_version}, max_length {self.max_length}, "
                       f"trainable {self.trainable}, ZeRO stage {strategy.stage}")

    # ------------------------------------------------------------------------------------ scoring
    @torch.no_grad()
    def score(self, questions: list[str], references: list[str], completions: list[str]) -> list[float]:
        """RM logits of the triples, in order (`rm.model.score_logits`, micro-batches of --cooper.rm_micro_batch_size)."""
        return score_logits(self.model, self.tokenizer, questions, references, completions, max_length=self.max_length,
                            template_version=self.template_version, batch_size=self.cooper.rm_micro_batch_size)

    # ----------------------------------------------------------------------------------- training
    def fit(self, pairs: PairBatch, global_valid: int) -> dict[str, float]:
        """Cooper's RM update on this rank's share of the step's pairs; metrics are global (all-reduced).

        pairs: this rank's pairs (invalid slots are skipped). global_valid: valid pairs over all ranks.
        With global_valid == 0 nothing is run and no step is taken.
        """
        if not self.trainable:
            raise RuntimeError("fit() on a reward model loaded without --remote_rm_trainable")
        if global_valid < 1:
            return {"cooper/rm_updated": 0.0, "cooper/rm_valid_pairs": 0.0,
                    "cooper/rm_optimizer_steps": float(self.counters["optimizer_steps"])}
        self.counters["updates"] += 1
        valid = [i for i, ok in enumerate(pairs.valid) if ok]
        per_micro = max(1, self.cooper.rm_micro_batch_size // 2)
        chunks = [valid[start : start + per_micro] for start in range(0, len(valid), per_micro)]
        micro_steps = int(self.strategy.all_reduce(float(len(chunks)), op="max"))
        world_size = torch.distributed.get_world_size()

        start = time.perf_counter()
        self.model.train()
        passes = [self._pass(pairs, chunks, micro_steps, global_valid, world_size)
                  for _ in range(self.cooper.rm_updates_per_step)]
        self.model.eval()
        seconds = time.perf_counter() - start
        first, last = passes[0], passes[-1]
        metrics = {**first["by_source"],
            "cooper/rm_updated": 1.0,
            "cooper/rm_loss": first["loss"],  # on the RM that scored this step's rollouts
            "cooper/rm_pair_accuracy": first["pair_accuracy"],
            "cooper/rm_margin": first["margin"],
            "cooper/rm_loss_last_pass": last["loss"],
            "cooper/rm_valid_pairs": float(global_valid),
            "cooper/rm_steps_skipped": float(sum(p["skipped"] for p in passes)),
            "cooper/rm_optimizer_steps": float(self.counters["optimizer_steps"]),
            "cooper/rm_lr": self.scheduler.get_last_lr()[0],
            # Not a timing/* key: beside the policy update it overlaps it, and OpenRLHF sums timing/* per step.
            "cooper/rm_fit_seconds": seconds,
        }
        applied = [p["grad_norm"] for p in passes if not p["skipped"]]
        if applied:
            metrics["cooper/rm_grad_norm"] = applied[-1]
        metrics["cooper/rm_rank_weight_spread"] = self.rank_weight_spread()
        return metrics

    @torch.no_grad()
    def rank_weight_spread(self) -> float:
        """How far the data-parallel ranks' RM weights are apart (0.0 when they agree, as they must: every rank
        applies the same reduced gradient). Compared as (sum, sum of squares) of all weights in float64
        (`weight_moments`), gathered through the strategy; any difference means the ranks trained different models."""
        mine = weight_moments(p.detach() for p in self.model.module.parameters())
        every = self.strategy.all_gather(mine.cpu()).view(-1, 2)
        return float((every - every[0]).abs().max())

    def _pass(self, pairs: PairBatch, chunks: list[list[int]], micro_steps: int, global_valid: int, world_size: int):
        """One pass over the valid pairs: `micro_steps` forward/backward, then one (possibly skipped) step."""
        sums = torch.zeros(3 + 2 * len(SOURCES), dtype=torch.float64)  # loss*k, correct, margin*k, per source: correct, k
        skipped_before = self.model.skipped_steps
        for micro in range(micro_steps):
            self.model.set_gradient_accumulation_boundary(micro == micro_steps - 1)
            if micro < len(chunks):
                loss = self._micro_loss(pairs, chunks[micro], sums) * (len(chunks[micro]) * world_size / global_valid)
            else:
                loss = rm_logits(self.model, self._filler).sum() * 0.0
            self.strategy.backward(loss, self.model, self.optim)
            self.strategy.optimizer_step(self.optim, self.model, self.scheduler)  # acts only at the boundary
        skipped = self.model.skipped_steps > skipped_before
        self.counters["skipped_steps" if skipped else "optimizer_steps"] += 1
        sums = self.strategy.all_reduce(sums, op="sum")
        by_source = {}
        for s, source in enumerate(SOURCES):
            correct, count = float(sums[3 + 2 * s]), float(sums[4 + 2 * s])
            by_source[f"cooper/rm_pairs_{source}"] = count
            if count:
                by_source[f"cooper/rm_pair_accuracy_{source}"] = correct / count
        return {
            "by_source": by_source,
            "loss": float(sums[0]) / global_valid,
            "pair_accuracy": float(sums[1]) / global_valid,
            "margin": float(sums[2]) / global_valid,
            "skipped": skipped,
            "grad_norm": self.strategy.get_grad_norm(self.model),
        }

    def _micro_loss(self, pairs: PairBatch, index: list[int], sums: torch.Tensor) -> torch.Tensor:
        """Masked pairwise loss of the pairs at `index` (all valid); adds their sums to `sums`."""
        k = len(index)
        questions = [pairs.questions[i] for i in index]
        references = [pairs.references[i] for i in index]
        completions = [pairs.positives[i] for i in index] + [pairs.negatives[i] for i in index]
        batch = render_and_encode(self.tokenizer, questions * 2, references * 2, completions, self.max_length,
                                  self.template_version)
        logits = rm_logits(self.model, batch)
        every_pair = torch.ones(k, dtype=torch.bool, device=logits.device)  # all valid; on the logits' device
        loss, metrics = pairwise_rm_loss(logits[:k], logits[k:], every_pair)
        sums[:3] += torch.tensor([metrics["loss"] * k, metrics["pair_accuracy"] * k, metrics["margin"] * k],
                                 dtype=torch.float64)
        correct = (logits[:k] > logits[k:]).tolist()
        for s, source in enumerate(SOURCES):  # the RM's pairwise accuracy per negative source, before the update
            mine = [ok for ok, i in zip(correct, index) if pairs.negative_source[i] == source]
            sums[3 + 2 * s] += sum(mine)
            sums[4 + 2 * s] += len(mine)
        if not math.isfinite(metrics["loss"]):
            # NaN gradients make DeepSpeed's overflow check drop the step on every rank (module docstring).
            loss = loss * float("nan")
        return loss

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
        self.counters = dict(states.get(COUNTERS_KEY, self.counters))
        keep = ("episode", "global_step", "total_consumed_prompts", COUNTERS_KEY)
        return {key: states[key] for key in keep if key in states}

    def save_model(self, out_dir: str) -> str:
        """Export the RM in the VerifyRM format (`rm.model.export_rm`); every rank must call it."""
        return str(export_rm(self.model, self.tokenizer, out_dir, template_version=self.template_version,
                             max_length=self.max_length))

    # ------------------------------------------------------------------------- colocation (sleep)
    def reload_states(self) -> None:
        reload_deepspeed_states(self.model)

    def offload_states(self) -> None:
        offload_deepspeed_states(self.model)
