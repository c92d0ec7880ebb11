"""The VerifyRM model: load, encode, score and export a one-logit sequence classifier.

This is the one loading path for reward models in cooper-openrlhf: the BCE recipe (`rm/bce_train.py`),
batch scoring (`rm/scorer.py`), the verifier benchmark CLI and the RL-time trainable RM actor
all go through `load_rm`, `render_and_encode` / `encode_rm_texts` and `rm_logits`; batch scoring and
the RL-time actor's scoring are one function (`score_logits`), and both trainers build their
optimizer from `adamw_config`.

- Model: `AutoModelForSequenceClassification` with `num_labels == 1`; anything else raises
  `NotASequenceClassifierError` naming the path and what was found (`check_reward_model` applies
  the same rules to a path's config alone, before any weights load). A backbone without a
  classification head (a causal LM such as a policy, or a bare encoder such as MiniLM's
  `BertModel`) is loaded with a new one-logit head only when asked (`init_head=True`): that is how a
  VerifyRM starts from a base model.
- Input: the RM template text (`algo/template.py`) tokenised right-padded and right-truncated to
  `max_length` tokens (`usable_max_length`: the caller's, else the export's, else
  `DEFAULT_RM_MAX_LENGTH`); the template version comes from the checkpoint's config (`CONFIG_KEY`).

Export and OpenRLHF compatibility: `rm/export.py`.
"""

import contextlib
import logging
import os
import re
from collections.abc import Sequence

import torch
import torch.nn as nn

from cooper_openrlhf.algo.template import (
    CONFIG_KEY,
    TEMPLATE_VERSION,
    render_rm_input,
    template_from_config,
)

logger = logging.getLogger(__name__)

DEFAULT_RM_MAX_LENGTH = 1024  # tokens per RM input, when neither the caller nor the export says


class NotASequenceClassifierError(ValueError):
    """The path does not hold a one-logit sequence classifier (and no new head was asked for)."""


# ---------------------------------------------------------------------------------------- loading
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def _read_config(path: str):
    from transformers import AutoConfig

    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        raise NotASequenceClassifierError(f"{path} is a folder without config.json: not a Hugging Face model folder")
    if not os.path.exists(path) and not _HUB_ID.fullmatch(path):  # transformers would call it a bad hub id
        raise NotASequenceClassifierError(f"{path}: folder does not exist")
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        if not os.path.exists(path):
            raise NotASequenceClassifierError(f"{path}: folder does not exist, nor could the hub serve it as a model "
                                              f"id ({str(exc).splitlines()[0]})") from None
        raise NotASequenceClassifierError(f"could not read a model config from {path}: {exc}") from exc


def _describe(config) -> str:
    return f"architectures {list(config.architectures or [])}, model_type {config.model_type!r}"


def _check_classifier(path: str, config, init_head: bool) -> bool:
    """True when the checkpoint already is a one-logit classifier; False when a new head must be made."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    architectures = list(config.architectures or [])
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        if config.num_labels != 1:
            raise NotASequenceClassifierError(
                f"{path} is a {config.num_labels}-label classifier ({_describe(config)}); a reward model has one logit"
            )
        return True
    if not init_head:
        raise NotASequenceClassifierError(
            f"{path} is not a sequence classifier ({_describe(config)}). To start a reward model from this "
            f"backbone with a new, randomly initialised one-logit head, pass init_head=True (CLI: --init-head)."
        )
    if config.model_type not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        raise NotASequenceClassifierError(
            f"{path} ({_describe(config)}): transformers has no sequence-classification class for this model type"
        )
    return False


def check_reward_model(path: str):
    """The config of the reward model at `path`; raises `NotASequenceClassifierError` unless it is a one-logit classifier.

    Reads only the config (no weights), with the rules of `load_rm`: a start-up check before the weights load.
    """
    config = _read_config(str(path))
    _check_classifier(str(path), config, init_head=False)
    return config


def _init_new_head(model: nn.Module, new_keys: list[str], zero3: bool) -> None:
    """Initialise the parameters the checkpoint did not have (the new head) like OpenRLHF's value head.

    Weights ~ N(0, 1/(hidden+1)) (OpenRLHF's `init_value_head`), biases 0. Done explicitly because
    under ZeRO-3 parameters created inside `zero.Init` are not initialised by transformers.
    """
    import torch.distributed as dist

    params = dict(model.named_parameters())
    new_params = [params[key] for key in new_keys if key in params]
    std = 1.0 / (model.config.hidden_size + 1)
    gather = gathered(new_params, modifier_rank=0) if zero3 else contextlib.nullcontext()
    with gather, torch.no_grad():
        if not zero3 or not dist.is_initialized() or dist.get_rank() == 0:
            for param in new_params:
                if param.dim() > 1:
                    param.normal_(0.0, std)
                else:
                    param.zero_()
    logger.info("initialised a new one-logit head: %s", sorted(new_keys))


def gathered(params: list, modifier_rank=None):
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank, enabled=bool(params))


def load_rm(
    path: str,
    *,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "eager",
    ds_config: dict | None = None,
    init_head: bool = False,
):
    """(model, tokenizer, template_version) of the reward model at `path`.

    dtype / attn_implementation: passed to `from_pretrained`. ds_config: a DeepSpeed train config;
    with ZeRO stage 3 the weights are partitioned while loading (transformers' `HfDeepSpeedConfig`,
    as OpenRLHF's `get_llm_for_sequence_regression` does). init_head: allow a folder without a
    classification head (causal LM, bare encoder) and give it a new one-logit head.
    The tokenizer always has a pad token (eos when it had none) and the model config's
    `pad_token_id` matches it; the template version is the checkpoint's (`CONFIG_KEY`) or the current one.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = str(path)
    config = _read_config(path)
    is_classifier = _check_classifier(path, config, init_head)
    if not is_classifier:
        config.num_labels = 1
    zero3 = ds_config is not None and ds_config.get("zero_optimization", {}).get("stage") == 3
    if zero3:
        from transformers.integrations.deepspeed import HfDeepSpeedConfig

        # Kept alive across from_pretrained: transformers reads it through a weak reference.
        ds_context = HfDeepSpeedConfig(ds_config)  # noqa: F841
    model, info = AutoModelForSequenceClassification.from_pretrained(
        path, config=config, dtype=dtype, attn_implementation=attn_implementation, output_loading_info=True
    )
    missing = list(info.get("missing_keys", []))
    if is_classifier and missing:
        logger.warning("%s: weights missing from the checkpoint and freshly initialised: %s", path, missing)
    if not is_classifier:
        _init_new_head(model, missing, zero3)

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {path} has neither a pad nor an eos token; batching needs one")
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("%s: tokenizer has no pad token; using eos %r", path, tokenizer.eos_token)
    tokenizer.padding_side = "right"
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer, recorded_template_version(model.config)


def recorded_template_version(config) -> str:
    """The template version a checkpoint was trained with, or the current one if it records none."""
    record = getattr(config, CONFIG_KEY, None)
    return template_from_config(record).version if record else TEMPLATE_VERSION


def recorded_max_length(config) -> int | None:
    """The `max_length` (tokens) a VerifyRM export was trained with, if it records one."""
    record = getattr(config, CONFIG_KEY, None) or {}
    return record.get("max_length")


def usable_max_length(model, requested: int | None = None) -> int:
    """Tokens per RM input: `requested`, else what the export records, else `DEFAULT_RM_MAX_LENGTH`.

    Capped (with a warning) at the backbone's position limit (e.g. 512 for MiniLM).
    """
    if requested is None:
        requested = recorded_max_length(unwrap(model).config) or DEFAULT_RM_MAX_LENGTH
    limit = getattr(unwrap(model).config, "max_position_embeddings", None)
    if limit is not None and requested > limit:
        logger.warning("max_length %d exceeds the model's %d positions; using %d", requested, limit, limit)
        return limit
    return requested


# --------------------------------------------------------------------------------- encode and score
def encode_rm_texts(tokenizer, texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
    """Right-padded `input_ids` and `attention_mask` (B, T), each row cut to at most `max_length` tokens.

    Cut rows lose their end (the tokenizer's right truncation, special tokens kept); their number is
    logged as a warning, since a cut completion may lose its final answer.
    """
    if not texts:
        raise ValueError("no texts to encode")
    # One tokenization in the common case: cut at one token past the limit, so a row that reaches it is one the
    # limit cuts; only those rows are encoded again, cut where the tokenizer's own truncation cuts (special tokens
    # kept).
    ids = tokenizer(list(texts), truncation=True, max_length=max_length + 1)["input_ids"]
    cut = [i for i, row in enumerate(ids) if len(row) > max_length]
    if cut:
        logger.warning("%d of %d RM inputs exceed %d tokens and are truncated", len(cut), len(texts), max_length)
        for i, row in zip(cut, tokenizer([texts[i] for i in cut], truncation=True, max_length=max_length)["input_ids"]):
            ids[i] = row
    encoded = tokenizer.pad({"input_ids": ids}, padding=True, padding_side="right", return_attention_mask=True,
                            return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def _check_triples(questions: Sequence[str], references: Sequence[str], completions: Sequence[str]) -> None:
    if not len(questions) == len(references) == len(completions):
        raise ValueError(
            f"questions, references and completions differ in length: "
            f"{len(questions)}, {len(references)}, {len(completions)}"
        )


def render_and_encode(
    tokenizer,
    questions: Sequence[str],
    references: Sequence[str],
    completions: Sequence[str],
    max_length: int,
    template_version: str = TEMPLATE_VERSION,
) -> dict[str, torch.Tensor]:
    """`encode_rm_texts` of the template texts of the (question, reference, completion) triples."""
    _check_triples(questions, references, completions)
    texts = [
        render_rm_input(q, r, c, template_version=template_version) for q, r, c in zip(questions, references, completions)
    ]
    return encode_rm_texts(tokenizer, texts, max_length)


def unwrap(model) -> nn.Module:
    """The transformers model inside a DeepSpeed engine (`.module`), or the model itself."""
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


def rm_logits(model, batch: dict) -> torch.Tensor:
    """(B,) float32 logits of a batch from `encode_rm_texts`; works on a model or a DeepSpeed engine.

    Gradients flow when called outside `torch.no_grad()`.
    """
    device = next(unwrap(model).parameters()).device
    output = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
    logits = output.logits if hasattr(output, "logits") else output
    if logits.dim() != 2 or logits.shape[-1] != 1:
        raise ValueError(f"expected (B, 1) logits from a one-logit classifier, got shape {tuple(logits.shape)}")
    return logits.squeeze(-1).float()


def score_logits(
    model,
    tokenizer,
    questions: Sequence[str],
    references: Sequence[str],
    completions: Sequence[str],
    *,
    max_length: int,
    template_version: str,
    batch_size: int,
) -> list[float]:
    """RM logits of the (question, reference, completion) triples, in input order.

    Puts `model` (a model or a DeepSpeed engine) in eval mode and runs it without gradients on
    micro-batches of `batch_size` triples (`render_and_encode`, right-padded: the batching changes a
    logit only by float rounding). The triples are taken shortest first, so a micro-batch pads its rows to a
    length near their own rather than to the longest of the whole call.
    """
    _check_triples(questions, references, completions)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    # eval() walks every module, a real share of a lone request's small forward, so only when due;
    # a DeepSpeed engine's own flag is not its module's when the module was put in training mode directly
    if model.training or getattr(model, "module", model).training:
        model.eval()
    order = sorted(range(len(questions)), key=lambda i: len(questions[i]) + len(references[i]) + len(completions[i]))
    logits = [0.0] * len(questions)
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            batch = render_and_encode(tokenizer, [questions[i] for i in chunk], [references[i] for i in chunk],
                                      [completions[i] for i in chunk], max_length, template_version)
            for i, logit in zip(chunk, rm_logits(model, batch).cpu().tolist()):
                logits[i] = logit
    return logits


# ------------------------------------------------------------------------------------------ training
def adamw_config(
    *,
    lr: float,
    weight_decay: float,
    lr_scheduler: str,
    warmup_ratio: float,
    max_norm: float,
    scheduler_steps: int,
    min_lr_ratio: float = 0.1,
) -> dict:
    """The `(model, config)` dict OpenRLHF's `DeepspeedStrategy.prepare` turns into an RM's optimizer and schedule.

    AdamW (betas 0.9 / 0.95, eps 1e-8, as OpenRLHF's own trainers) with gradient clipping at `max_norm`,
    and the transformers schedule `lr_scheduler` warming up over `warmup_ratio` of `scheduler_steps`
    (at least 1) optimizer steps and decaying to `min_lr_ratio` * lr (`cosine_with_min_lr`).
    """
    return {
        "optim": "adam",
        "adam": {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": weight_decay},
        "lr_scheduler": lr_scheduler,
        "lr_warmup_ratio": warmup_ratio,
        "min_lr_ratio": min_lr_ratio,
        "max_norm": max_norm,
        "scheduler_steps": max(1, scheduler_steps),
    }
