"""Cooper's RM update (arXiv 2508.05613, Eq. 5) as plain functions on a DeepSpeed engine + optimizer.

One code path for both places the RM learns: `ray/reward_actor.py` (a data-parallel Ray actor of the trainer)
and `serve/learner.py` (the reward service, one process). Both prepare the RM with OpenRLHF's
`DeepspeedStrategy.prepare((model, adamw_config(...)))`, so the optimizer, schedule, clipping and overflow
handling are DeepSpeed's in both; the caller adds Ray (the actor) or HTTP (the service) around it.

`pairwise_update` runs one update on one rank's share of the step's pairs:
- only valid pairs are forwarded; the positive and negative of a pair share one forward;
- the micro-batch loss is scaled by (pairs in it) * world / global_valid, so that after DeepSpeed averages
  gradients over the ranks the step's gradient is that of the masked mean over exactly the step's valid
  pairs, however they are spread across ranks;
- gradient accumulation is driven by hand (`set_gradient_accumulation_boundary`; the RM's DeepSpeed config has
  gradient_accumulation_steps 1, so no loss is rescaled), one optimizer step per pass, `passes` passes; every
  rank runs the same number of backward passes (a rank with fewer pairs backs up a zero loss), as ZeRO's
  gradient reductions are collective;
- a non-finite loss makes that micro-batch's gradients NaN on purpose, so that DeepSpeed's own overflow check
  (ZeRO 1/2, bf16 and fp16) drops the whole accumulated step on every rank, exactly as it does for non-finite
  gradients; skipped steps are counted from the engine (`skipped_steps`);
- anchored (not the paper's; `--cooper.rm_anchor_weight` w > 0): each pass also takes VerifyRM's own loss, BCE
  against the rule verifier's labels (`algo.losses.bce_rm_loss`), on a batch of labelled anchor rows
  (`rm/anchors.py`: rows kept apart from the ones RM health reads), so the step's loss is pairwise mean + w x BCE
  mean. The labelled rows tie what the RM pays to right and wrong, which the pairwise loss leaves free (it fixes
  only differences: the probe lab's collapsed RMs paid everything 0.03, or wrong answers 0.97).
"""

import math
import time
from dataclasses import dataclass, field

import torch

from cooper_openrlhf.algo.losses import bce_rm_loss, pairwise_rm_loss
from cooper_openrlhf.algo.pairs import PairBatch
from cooper_openrlhf.algo.selection import FROM_ASSISTANT, FROM_ROLLOUT
from cooper_openrlhf.rm.model import render_and_encode, rm_logits

SOURCES = (FROM_ASSISTANT, FROM_ROLLOUT)  # negative sources whose pair accuracy is reported


@dataclass
class RMTrainer:
    """What one RM update needs: the prepared engine, its optimizer and schedule, the strategy for collectives."""

    strategy: object  # OpenRLHF DeepspeedStrategy (all_reduce, backward, optimizer_step, get_grad_norm)
    model: object  # the DeepSpeed engine of the RM (strategy.prepare)
    optim: object
    scheduler: object
    tokenizer: object
    max_length: int  # tokens per RM input
    template_version: str
    micro_batch_size: int  # RM inputs per forward (a pair is two)
    counters: dict = field(default_factory=lambda: {"optimizer_steps": 0, "skipped_steps": 0, "updates": 0})

    def __post_init__(self) -> None:
        # A zero-loss input for ranks without pairs in a micro-step (keeps ZeRO's collectives aligned).
        self.filler = render_and_encode(self.tokenizer, [""], [""], [""], self.max_length, self.template_version)


def pairwise_update(trainer: RMTrainer, pairs: PairBatch, global_valid: int, passes: int = 1, anchors=(),
                    anchor_weight: float = 0.0) -> dict[str, float]:
    """Cooper's RM update on this rank's share of the step's pairs; metrics are global (all-reduced).

    pairs: this rank's pairs (invalid slots are skipped). global_valid: valid pairs over all ranks (this rank's
    own in a single process). passes: optimizer steps over the same pairs. With global_valid == 0 nothing runs.
    anchors, anchor_weight: with a weight > 0, this rank's share of the step's labelled anchor rows (`rm.probes.Probe`
    with `.correct`), whose BCE joins the loss at that weight (module docstring); every rank passes the same weight.
    """
    if global_valid < 1:
        return {"cooper/rm_updated": 0.0, "cooper/rm_valid_pairs": 0.0,
                "cooper/rm_optimizer_steps": float(trainer.counters["optimizer_steps"])}
    trainer.counters["updates"] += 1
    valid = [i for i, ok in enumerate(pairs.valid) if ok]
    per_micro = max(1, trainer.micro_batch_size // 2)
    chunks = [valid[start : start + per_micro] for start in range(0, len(valid), per_micro)]
    micro_steps = int(trainer.strategy.all_reduce(float(len(chunks)), op="max"))
    world_size = torch.distributed.get_world_size()

    anchored = _Anchored.of(trainer, list(anchors), anchor_weight, world_size) if anchor_weight > 0 else None
    start = time.perf_counter()
    trainer.model.train()
    done = []
    for index in range(passes):
        if anchored is not None:
            anchored.recording = index == 0
        done.append(_pass(trainer, pairs, chunks, micro_steps, global_valid, world_size, anchored))
    trainer.model.eval()
    seconds = time.perf_counter() - start
    first, last = done[0], done[-1]
    metrics = {**first["by_source"],
        "cooper/rm_updated": 1.0,
        "cooper/rm_loss": first["loss"],  # on the RM that scored these rollouts
        "cooper/rm_pair_accuracy": first["pair_accuracy"],
        "cooper/rm_margin": first["margin"],
        "cooper/rm_loss_last_pass": last["loss"],
        "cooper/rm_valid_pairs": float(global_valid),
        "cooper/rm_steps_skipped": float(sum(p["skipped"] for p in done)),
        "cooper/rm_optimizer_steps": float(trainer.counters["optimizer_steps"]),
        "cooper/rm_lr": trainer.scheduler.get_last_lr()[0],
        # Not a timing/* key: beside the policy update it overlaps it, and OpenRLHF sums timing/* per step.
        "cooper/rm_fit_seconds": seconds,
    }
    if anchored is not None:
        metrics.update(anchored.metrics(trainer.strategy))
    applied = [p["grad_norm"] for p in done if not p["skipped"]]
    if applied:
        metrics["cooper/rm_grad_norm"] = applied[-1]
    return metrics


def _pass(trainer: RMTrainer, pairs: PairBatch, chunks: list[list[int]], micro_steps: int, global_valid: int,
          world_size: int, anchored: "_Anchored | None" = None) -> dict:
    """One pass over the valid pairs: `micro_steps` forward/backward (then the anchors' with an anchored update),
    then one (possibly skipped) step."""
    strategy, model = trainer.strategy, trainer.model
    sums = torch.zeros(3 + 2 * len(SOURCES), dtype=torch.float64)  # loss*k, correct, margin*k, per source: correct, k
    skipped_before = model.skipped_steps
    total = micro_steps + (anchored.micro_steps if anchored is not None else 0)
    for micro in range(total):
        model.set_gradient_accumulation_boundary(micro == total - 1)
        if micro >= micro_steps:
            loss = anchored.micro_loss(trainer, micro - micro_steps)
        elif micro < len(chunks):
            loss = _micro_loss(trainer, pairs, chunks[micro], sums) * (len(chunks[micro]) * world_size / global_valid)
        else:
            loss = rm_logits(model, trainer.filler).sum() * 0.0
        strategy.backward(loss, model, trainer.optim)
        strategy.optimizer_step(trainer.optim, model, trainer.scheduler)  # acts only at the boundary
    skipped = model.skipped_steps > skipped_before
    trainer.counters["skipped_steps" if skipped else "optimizer_steps"] += 1
    sums = strategy.all_reduce(sums, op="sum")
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
        "grad_norm": strategy.get_grad_norm(model),
    }


def _micro_loss(trainer: RMTrainer, pairs: PairBatch, index: list[int], sums: torch.Tensor) -> torch.Tensor:
    """Masked pairwise loss of the pairs at `index` (all valid); adds their sums to `sums`."""
    k = len(index)
    questions = [pairs.questions[i] for i in index]
    references = [pairs.references[i] for i in index]
    completions = [pairs.positives[i] for i in index] + [pairs.negatives[i] for i in index]
    batch = render_and_encode(trainer.tokenizer, questions * 2, references * 2, completions, trainer.max_length,
                              trainer.template_version)
    logits = rm_logits(trainer.model, batch)
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


@dataclass
class _Anchored:
    """The anchored part of one update on one rank: its rows in micro-batches, the same count on every rank."""

    rows: list  # this rank's anchor rows
    weight: float
    micro_steps: int  # anchor micro-batches per pass, the most any rank has (ranks with fewer back up a zero loss)
    scale: float  # world / global rows: after DeepSpeed's mean over ranks, the gradient of the global mean BCE
    per_micro: int
    recording: bool = True  # add the losses to `sums` (the first pass: the RM before this update)
    sums: dict = field(default_factory=lambda: {"loss": 0.0, "correct": 0.0, "rows": 0.0})  # floats: summed by the strategy

    @classmethod
    def of(cls, trainer: RMTrainer, rows: list, weight: float, world_size: int) -> "_Anchored":
        per_micro = max(1, trainer.micro_batch_size)
        total = trainer.strategy.all_reduce(float(len(rows)), op="sum")
        micro_steps = int(trainer.strategy.all_reduce(float(-(-len(rows) // per_micro)), op="max"))
        return cls(rows, weight, micro_steps, world_size / total if total else 0.0, per_micro)

    def micro_loss(self, trainer: RMTrainer, index: int) -> torch.Tensor:
        part = self.rows[index * self.per_micro:(index + 1) * self.per_micro]
        if not part:
            return rm_logits(trainer.model, trainer.filler).sum() * 0.0
        batch = render_and_encode(trainer.tokenizer, [r.question for r in part], [r.reference for r in part],
                                  [r.completion for r in part], trainer.max_length,
                                  trainer.template_version)
        logits = rm_logits(trainer.model, batch)
        labels = torch.tensor([float(r.correct) for r in part], device=logits.device)
        loss, metrics = bce_rm_loss(logits, labels)
        k = len(part)
        if self.recording:
            self.sums["loss"] += metrics["loss"] * k
            self.sums["correct"] += metrics["accuracy"] * k
            self.sums["rows"] += k
        return loss * (self.weight * k * self.scale)

    def metrics(self, strategy) -> dict[str, float]:
        """cooper/rm_anchor_loss and cooper/rm_anchor_accuracy (first pass: the RM before the update), all ranks."""
        summed = strategy.all_reduce(dict(self.sums), op="sum")
        loss, correct, rows = (float(summed[key]) for key in ("loss", "correct", "rows"))
        return {"cooper/rm_anchor_loss": loss / rows if rows else float("nan"),
                "cooper/rm_anchor_accuracy": correct / rows if rows else float("nan"), "cooper/rm_anchor_rows": rows}
