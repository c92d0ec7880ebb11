"""A VerifyRM folder written, and whether stock OpenRLHF's loader reproduces its scores.

Export: `save_pretrained` of model and tokenizer with the template record (plus `max_length` and whether
OpenRLHF's loader reproduces the scores) in the config, written to a temporary sibling and renamed into place, so a
crash never leaves a half-written export. DeepSpeed engines are unwrapped and ZeRO-3 partitions gathered.

OpenRLHF compatibility: `openrlhf.models.get_llm_for_sequence_regression(path, "reward")` rebuilds the
model as `AutoModel` backbone + a bias-free linear head named `score` applied to the last attended
token. For decoder backbones (`Qwen2ForSequenceClassification`, `LlamaForSequenceClassification`, ...)
that is exactly transformers' classifier, so both loaders give the same scores. Encoder classifiers
(BERT/MiniLM: CLS pooler + `classifier` with a bias) cannot be rebuilt that way: OpenRLHF would
score them with a fresh random head. `openrlhf_compatibility` detects this, `export_rm` records and
warns about it, and `require_openrlhf_compatible` fails clearly before such a path is handed to
stock OpenRLHF.
"""

import logging
import os
import shutil
from pathlib import Path

import torch
import torch.nn as nn

from cooper_openrlhf.algo.template import CONFIG_KEY, TEMPLATE_VERSION, template_config
from cooper_openrlhf.rm.model import check_reward_model, gathered, unwrap

logger = logging.getLogger(__name__)


class OpenRLHFIncompatibleError(ValueError):
    """OpenRLHF's `get_llm_for_sequence_regression` would not reproduce this reward model's scores."""


# ------------------------------------------------------------------------------ OpenRLHF compatibility
def openrlhf_compatibility(model) -> tuple[bool, str]:
    """(True, "") when OpenRLHF's `get_llm_for_sequence_regression(..., "reward")` rebuilds the same scorer.

    That loader builds `AutoModel` for the config plus a bias-free `nn.Linear(hidden, 1)` named `score`,
    read at the last attended token. Transformers' decoder classifiers have exactly that shape (and pool
    the last non-pad token, the same token under right padding); encoder classifiers do not.
    """
    from transformers import AutoModel

    model = unwrap(model)
    head = getattr(model, "score", None)
    try:
        backbone_class = AutoModel._model_mapping[type(model.config)]
    except KeyError:
        backbone_class = None
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if isinstance(head, nn.Linear) and head.out_features == 1 and head.bias is None and type(backbone) is backbone_class:
        return True, ""
    return False, (
        f"{type(model).__name__} is not a decoder backbone with a bias-free linear `score` head on the last token, "
        f"so openrlhf.models.get_llm_for_sequence_regression(..., 'reward') would score it with a new random head. "
        f"Score it through cooper_openrlhf (rm.model.load_rm, rm.scorer.RMScorer, cooper serve --rm, "
        f"cooper inspect eval-verifier --verifier rm); "
        f"for a reward model stock OpenRLHF can load, train from a decoder backbone (e.g. Qwen2, Llama)."
    )


def require_openrlhf_compatible(path: str) -> None:
    """Raise `OpenRLHFIncompatibleError` if stock OpenRLHF would not reproduce the scores of the RM at `path`."""
    from transformers import AutoModelForSequenceClassification

    config = check_reward_model(path)
    record = getattr(config, CONFIG_KEY, None) or {}
    if "openrlhf_compatible" in record:
        compatible, reason = record["openrlhf_compatible"], record.get("openrlhf_incompatible_reason", "")
    else:
        with torch.device("meta"):
            compatible, reason = openrlhf_compatibility(AutoModelForSequenceClassification.from_config(config))
    if not compatible:
        raise OpenRLHFIncompatibleError(f"{path}: {reason}")


# ------------------------------------------------------------------------------------------ export
def _is_zero3(module: nn.Module) -> bool:
    return any(hasattr(param, "ds_id") for param in module.parameters())


def _gathered_state_dict(module: nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """Full state dict of a ZeRO-3 partitioned module, on CPU on rank 0 (empty elsewhere); every rank must call."""
    params = dict(module.named_parameters(remove_duplicate=False))
    state = {}
    for key, value in module.state_dict(keep_vars=True).items():
        if key in params:
            with gathered([params[key]]):
                if rank == 0:
                    state[key] = params[key].data.detach().cpu().clone()
        elif rank == 0:
            state[key] = value.detach().cpu().clone()
    return state


def export_rm(model, tokenizer, out_dir, *, template_version: str = TEMPLATE_VERSION, max_length: int | None = None) -> Path:
    """Save `model` (or a DeepSpeed engine's module) and `tokenizer` as a VerifyRM folder; returns its path.

    The config records `template_config(template_version)` under `CONFIG_KEY`, plus `max_length` and
    `openrlhf_compatible` (with the reason when False, also logged as a warning). Rank 0 writes into a
    temporary sibling folder that is renamed into place (an existing export is replaced only then); in a
    distributed run every rank must call this (ZeRO-3 gathers are collective) and all wait for rank 0.
    """
    import torch.distributed as dist

    module = unwrap(model)
    out = Path(out_dir)
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    state = _gathered_state_dict(module, rank) if _is_zero3(module) else None
    if rank == 0:
        compatible, reason = openrlhf_compatibility(module)
        if not compatible:
            logger.warning("export %s: the folder is a VerifyRM that this package's loaders read with its trained "
                           "head (rm.model.load_rm, cli.serve --rm, cli.evaluate); only stock OpenRLHF's loader cannot: "
                           "%s", out, reason)
        record = dict(template_config(template_version), max_length=max_length, openrlhf_compatible=compatible)
        if reason:
            record["openrlhf_incompatible_reason"] = reason
        setattr(module.config, CONFIG_KEY, record)
        module.config.pad_token_id = tokenizer.pad_token_id
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        module.save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
        logger.info("exported reward model to %s (template %s, max_length %s)", out, template_version, max_length)
    if distributed:
        dist.barrier()
    return out
