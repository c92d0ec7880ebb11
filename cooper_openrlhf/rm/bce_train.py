"""BCE training of a VerifyRM (Cooper, arXiv 2508.05613 sec. 3.1) on OpenRLHF's DeepspeedStrategy.

A one-logit sequence classifier reads the RM template text of (question, reference, completion) and is
trained with `algo.losses.bce_rm_loss` against the annotation labels. Everything distributed is
OpenRLHF's and DeepSpeed's: `openrlhf.utils.get_strategy` on OpenRLHF's own argument namespace
(ZeRO stage, dtype (`--ds.param_dtype`, default auto: see runtime/dtype.py), micro/global batch -> gradient accumulation, seed), `strategy.prepare` builds the
AdamW optimizer and transformers' warm-up-and-decay scheduler inside DeepSpeed, and the distributed
sampler comes from `strategy.setup_dataloader`.

Each epoch ends with an evaluation on a held-out split (split by question, so its questions are unseen)
-- loss, accuracy, precision, recall, F1 -- and the best epoch so far is exported with `rm.export.export_rm`.
Run directory layout (`out`):
  best/               the best checkpoint (a VerifyRM export)
  metrics.jsonl       one line per optimizer step ("train") and per epoch ("eval")
  tensorboard/        the same scalars, when tensorboard is installed
  eval_split.jsonl    the held-out rows (as read), for later comparison with other verifiers
  train_summary.json  settings, data counts, per-epoch evaluation, the best epoch

Single process on CPU (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT default to a one-rank gloo group) or
any number of ranks under `deepspeed` / `torchrun`; every rank evaluates the whole eval split (needed
under ZeRO-3, where every forward is collective) and rank 0 writes the files.
"""

import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cooper_openrlhf.runtime.registry import Registry
from cooper_openrlhf.rm.data import (
    LabelledTriple,
    RecipeDataError,
    label_counts,
    load_labelled,
    require_both_classes,
    split_by_question,
)

logger = logging.getLogger(__name__)

BEST_METRICS = Registry("best_metric", {"accuracy": "higher", "f1": "higher", "loss": "lower"})  # -> better direction
# OpenRLHF flags this recipe sets unless the user gives them (later flags win in argparse).
# --ds.param_dtype defaults to auto (the device's fast dtype; runtime/openrlhf_args.py).
OPENRLHF_DEFAULTS = ["--ds.zero_stage", "2", "--ds.attn_implementation", "eager",
                     "--train.micro_batch_size", "4", "--train.batch_size", "16"]


@dataclass(frozen=True)
class TrainConfig:
    """The recipe's own settings; distributed ones (ZeRO, dtype, batch sizes, seed) are OpenRLHF flags."""

    pretrain: str
    data: str
    out: str
    eval_data: str | None = None
    eval_fraction: float = 0.2
    split_seed: int = 0
    init_head: bool = False
    epochs: int = 3
    lr: float = 2e-5
    lr_scheduler: str = "cosine_with_min_lr"
    warmup_ratio: float = 0.1
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    max_norm: float = 1.0
    max_length: int = 1024
    eval_batch_size: int = 16
    best_metric: str = "accuracy"
    tensorboard: bool = True
    tensorboard_dir: str | None = None  # default: <out>/tensorboard
    wandb_key: str | None = None  # log to Weights & Biases too (OpenRLHF's --logger.wandb.key)
    wandb_project: str = "cooper_verifyrm"
    wandb_run_name: str | None = None  # default: the output folder's name

    def __post_init__(self) -> None:
        BEST_METRICS.check(self.best_metric)
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")


def load_splits(config: TrainConfig) -> tuple[list[LabelledTriple], list[LabelledTriple]]:
    """(train, eval) rows; refuses an empty or one-class training set and an empty eval set."""
    rows = load_labelled(config.data)
    require_both_classes(rows, f"training data ({config.data})")
    if config.eval_data:
        train, held_out = rows, load_labelled(config.eval_data)
    else:
        train, held_out = split_by_question(rows, config.eval_fraction, config.split_seed)
        require_both_classes(train, f"the training split of {config.data} (--split-seed {config.split_seed})")
    if not held_out:
        raise RecipeDataError(
            f"the eval split of {config.eval_data or config.data} is empty; raise --eval-fraction or pass --eval.dataset"
        )
    if 0 in label_counts(held_out).values():
        logger.warning("the eval split has one class only (%s); F1 and precision are degenerate", label_counts(held_out))
    return train, held_out


def _set_single_process_defaults() -> None:
    """A one-rank process group when not launched by deepspeed/torchrun (which set these themselves)."""
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)


def make_strategy(openrlhf_argv: list[str]):
    """OpenRLHF's DeepspeedStrategy from its own parser: `OPENRLHF_DEFAULTS` overridden by `openrlhf_argv`."""
    from cooper_openrlhf.runtime import install_cpu_runtime

    install_cpu_runtime()  # before anything imports openrlhf.models; a no-op where CUDA exists
    _set_single_process_defaults()
    from openrlhf.utils import get_strategy

    from cooper_openrlhf.runtime.openrlhf_args import parse_openrlhf_args

    args = parse_openrlhf_args([*OPENRLHF_DEFAULTS, *openrlhf_argv])
    strategy = get_strategy(args)
    strategy.setup_distributed()
    return strategy


class _MetricsLog:
    """metrics.jsonl (+ tensorboard) on rank 0, fresh per run; lines are flushed so a crash keeps what was logged."""

    def __init__(self, out: Path, rank: int, config: TrainConfig):
        self.rank, self.writer, self.handle, self.wandb = rank, None, None, None
        if rank != 0:
            return
        self.handle = open(out / "metrics.jsonl", "w", encoding="utf-8")
        if config.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                logger.warning("tensorboard is not installed; metrics go to metrics.jsonl only")
            else:
                self.writer = SummaryWriter(config.tensorboard_dir or str(out / "tensorboard"))
        if config.wandb_key:
            import wandb  # an OpenRLHF dependency

            wandb.login(key=config.wandb_key, relogin=True)
            self.wandb = wandb.init(project=config.wandb_project, name=config.wandb_run_name or out.name,
                                    dir=str(out), config=asdict(config) | {"wandb_key": "(set)"})

    def log(self, kind: str, step: int, values: dict) -> None:
        if self.rank != 0:
            return
        self.handle.write(json.dumps({"kind": kind, "step": step, **values}) + "\n")
        self.handle.flush()
        scalars = {f"{kind}/{key}": value for key, value in values.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)}
        if self.writer is not None:
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def _collate(tokenizer, max_length: int, template_version: str):
    import torch

    from cooper_openrlhf.rm.model import render_and_encode

    def collate(rows: list[LabelledTriple]) -> dict:
        batch = render_and_encode(tokenizer, [r.question for r in rows], [r.reference for r in rows],
                                  [r.completion for r in rows], max_length, template_version)
        batch["labels"] = torch.tensor([float(r.label) for r in rows])
        return batch

    return collate


def evaluate(model, rows: list[LabelledTriple], collate, batch_size: int) -> dict:
    """BCE loss and binary metrics (predicted correct: logit >= 0, i.e. sigmoid >= 0.5) over `rows`."""
    import torch

    from cooper_openrlhf.algo.losses import bce_rm_loss
    from cooper_openrlhf.algo.rewards import probability_correct
    from cooper_openrlhf.rm.model import rm_logits
    from cooper_openrlhf.verify.metrics import binary_metrics

    model.eval()
    logits, labels = [], []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = collate(rows[start : start + batch_size])
            logits.append(rm_logits(model, batch).cpu())
            labels.append(batch["labels"])
    model.train()
    logits, labels = torch.cat(logits), torch.cat(labels)
    loss, _ = bce_rm_loss(logits, labels)
    metrics = binary_metrics((logits >= 0).tolist(), (labels > 0.5).tolist())
    return {"loss": float(loss), "accuracy": metrics.accuracy, "precision": metrics.precision,
            "recall": metrics.recall, "f1": metrics.f1, "n": metrics.n,
            "mean_reward": float(probability_correct(logits).mean())}


def _is_better(metric: str, new: dict, old: dict) -> bool:
    """`new` beats `old` on `metric`, or ties on it with a lower eval loss (full ties keep the earlier epoch)."""
    if new[metric] != old[metric]:
        return new[metric] < old[metric] if BEST_METRICS[metric] == "lower" else new[metric] > old[metric]
    return new["loss"] < old["loss"]


def _mean_over_ranks(strategy, values: list[float]) -> float:
    """Mean of every rank's `values`. Through the strategy, which moves the sums to the collective's device
    (NCCL takes CUDA tensors only) and back."""
    import torch

    total = strategy.all_reduce(torch.tensor([sum(values), float(len(values))], dtype=torch.float64), op="sum")
    return float(total[0] / total[1]) if total[1] else float("nan")


def train(config: TrainConfig, openrlhf_argv: list[str] = ()) -> dict:
    """Train, evaluate each epoch, export the best epoch to `out/best`; returns the summary (all ranks)."""
    import torch
    import torch.distributed as dist

    from cooper_openrlhf.algo.losses import bce_rm_loss
    from cooper_openrlhf.rm.model import adamw_config, load_rm, rm_logits, usable_max_length
    from cooper_openrlhf.rm.export import export_rm
    from cooper_openrlhf.runtime.dtype import torch_dtype

    train_rows, eval_rows = load_splits(config)  # before any process group: bad data fails fast
    strategy = make_strategy(list(openrlhf_argv))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(config.out)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "eval_split.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row.row) + "\n" for row in eval_rows)
    ds_args = strategy.args.ds
    dtype = torch_dtype(ds_args.param_dtype)  # already resolved from auto by parse_openrlhf_args
    model, tokenizer, template_version = load_rm(
        config.pretrain, dtype=dtype, attn_implementation=ds_args.attn_implementation,
        ds_config=strategy.get_ds_train_config(), init_head=config.init_head,
    )
    max_length = usable_max_length(model, config.max_length)
    collate = _collate(tokenizer, max_length, template_version)

    micro, accumulation = strategy.micro_train_batch_size, strategy.accumulated_gradient
    loader = strategy.setup_dataloader(train_rows, micro, shuffle=True, collate_fn=collate, drop_last=False)
    # Accumulation carries over epoch ends (DeepSpeed counts micro batches), so the run makes
    # (micro batches per epoch * epochs) // accumulation optimizer steps; the schedule spans exactly those.
    optimizer_steps = max(1, len(loader) * config.epochs // accumulation)
    optim_cfg = adamw_config(lr=config.lr, weight_decay=config.weight_decay, lr_scheduler=config.lr_scheduler,
                             warmup_ratio=config.warmup_ratio, min_lr_ratio=config.min_lr_ratio,
                             max_norm=config.max_norm, scheduler_steps=optimizer_steps)
    engine, _, scheduler = strategy.prepare((model, optim_cfg))
    engine.train()
    logger.info("training on %d rows (%s), evaluating on %d (%s); %d ranks, micro batch %d, accumulation %d, "
                "%d micro batches per epoch per rank, %d optimizer steps, ZeRO-%d %s", len(train_rows),
                label_counts(train_rows), len(eval_rows), label_counts(eval_rows), world, micro, accumulation,
                len(loader), optimizer_steps, strategy.stage, ds_args.param_dtype)

    log = _MetricsLog(out, rank, config)
    history, best, started = [], None, time.perf_counter()
    window_loss, window_accuracy = [], []
    try:
        for epoch in range(config.epochs):
            loader.sampler.set_epoch(epoch)
            for batch in loader:
                logits = rm_logits(engine, batch)
                loss, metrics = bce_rm_loss(logits, batch["labels"].to(logits.device))
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"non-finite BCE loss {loss.item()} at epoch {epoch}, optimizer step {engine.global_steps}"
                    )
                strategy.backward(loss, engine, None)
                step_before, lr = engine.global_steps, scheduler.get_last_lr()[0]  # the lr this step uses
                strategy.optimizer_step(None, engine, scheduler)
                window_loss.append(metrics["loss"])
                window_accuracy.append(metrics["accuracy"])
                if engine.global_steps != step_before:  # an optimizer step happened (accumulation boundary)
                    log.log("train", engine.global_steps, {
                        "epoch": epoch, "loss": _mean_over_ranks(strategy, window_loss),
                        "accuracy": _mean_over_ranks(strategy, window_accuracy), "lr": lr,
                        "grad_norm": strategy.get_grad_norm(engine), "seconds": time.perf_counter() - started,
                    })
                    window_loss, window_accuracy = [], []
            result = {"epoch": epoch, **evaluate(engine, eval_rows, collate, config.eval_batch_size)}
            history.append(result)
            log.log("eval", engine.global_steps, result)
            improved = best is None or _is_better(config.best_metric, result, best)
            if improved:
                best = result
                export_rm(engine, tokenizer, out / "best", template_version=template_version, max_length=max_length)
            if rank == 0:
                logger.info("epoch %d: eval loss %.4f accuracy %.4f f1 %.4f%s", epoch, result["loss"], result["accuracy"],
                            result["f1"], " (best so far, exported)" if improved else "")
    finally:
        log.close()

    summary = {
        "settings": asdict(config), "openrlhf_argv": list(openrlhf_argv), "world_size": world,
        "zero_stage": strategy.stage, "param_dtype": ds_args.param_dtype, "template_version": template_version,
        "max_length": max_length, "train_rows": len(train_rows), "train_labels": label_counts(train_rows),
        "eval_rows": len(eval_rows), "eval_labels": label_counts(eval_rows), "optimizer_steps": engine.global_steps,
        "history": history, "best": best, "best_metric": config.best_metric, "best_checkpoint": str(out / "best"),
        "seconds": time.perf_counter() - started,
    }
    if rank == 0:
        (out / "train_summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary
