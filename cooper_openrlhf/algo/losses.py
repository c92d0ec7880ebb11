"""Reward-model losses: pure tensor functions.

Cooper (arXiv 2508.05613) trains its reward model in two places:
- VerifyRM (sec. 3.1): binary cross-entropy on labelled (question, reference, completion) triples.
- The RL-time RM update (sec. 3.2, Eq. 5): a pairwise Bradley-Terry loss on (positive, negative)
  pairs, -log sigmoid(r_pos - r_neg), averaged over the prompts whose pair is valid.

Every loss returns the scalar loss and a dict of float metrics; masked-out rows contribute
nothing to the loss or its gradient. With no valid row the loss is an exact 0 that still
depends on the logits (so callers can run backward unconditionally) and `metrics["valid"] = 0`.
"""

import torch
import torch.nn.functional as F


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of values where mask; an exact (grad-carrying) 0 when mask is all False."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def pairwise_rm_loss(
    logits_pos: torch.Tensor, logits_neg: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Cooper's RM update (Eq. 5): masked mean of -log sigmoid(logit_pos - logit_neg).

    logits_pos, logits_neg: (P,) RM logits of each prompt's positive and negative completion.
    valid: (P,) bool, True where the prompt has both a verified positive and a valid negative.
    Metrics: loss, pair_accuracy (share of valid pairs with logit_pos > logit_neg), margin (mean
    logit_pos - logit_neg over valid pairs), valid (number of valid pairs).
    """
    if not logits_pos.shape == logits_neg.shape == valid.shape or logits_pos.dim() != 1:
        raise ValueError(
            f"need three (P,) tensors, got {tuple(logits_pos.shape)}, {tuple(logits_neg.shape)}, {tuple(valid.shape)}"
        )
    valid = valid.bool()
    margin = logits_pos.float() - logits_neg.float()
    loss = _masked_mean(-F.logsigmoid(margin), valid)
    with torch.no_grad():
        count = int(valid.sum())
        metrics = {
            "loss": float(loss),
            "pair_accuracy": float(_masked_mean((margin > 0).float(), valid)) if count else 0.0,
            "margin": float(_masked_mean(margin, valid)) if count else 0.0,
            "valid": float(count),
        }
    return loss, metrics


def bce_rm_loss(
    logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """VerifyRM's loss (sec. 3.1): masked mean binary cross-entropy of sigmoid(logit) against 0/1 labels.

    logits: (B,) RM logits. labels: (B,) 1.0 = correct, 0.0 = incorrect. valid: (B,) bool or None (all).
    Metrics: loss, accuracy at the 0.5 threshold (logit > 0), valid (rows counted).
    """
    if logits.shape != labels.shape or logits.dim() != 1:
        raise ValueError(f"need two (B,) tensors, got {tuple(logits.shape)} and {tuple(labels.shape)}")
    valid = torch.ones_like(labels, dtype=torch.bool) if valid is None else valid.bool()
    per_row = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none")
    loss = _masked_mean(per_row, valid)
    with torch.no_grad():
        correct = ((logits > 0) == (labels > 0.5)).float()
        count = int(valid.sum())
        metrics = {
            "loss": float(loss),
            "accuracy": float(_masked_mean(correct, valid)) if count else 0.0,
            "valid": float(count),
        }
    return loss, metrics

