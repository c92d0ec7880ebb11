"""The RM's training state held in memory before an update, so an update the RM guard rejects can be undone.

`EngineSnapshot.take(trainer)` copies, to the CPU, everything a DeepSpeed ZeRO 1/2 step changes on this rank: the
model's weights (every rank holds them whole), the optimizer's fp32 master partition and its per-parameter state
(Adam's moments and step), the optimizer's param groups (their lr and step), the LR scheduler's state, the
engine's step counters and the RM update's counters (`rm.pairwise_update.RMTrainer.counters`). `restore()` copies
them back in place (the model's weights are views into ZeRO's flat buffers, so they are written, never
replaced), and the engine is exactly where it was: the next update computes what it would have without the
rejected one. Every rank takes and restores its own share; the ranks stay identical.

Cost: one copy of the weights and of this rank's optimizer partition per update (for a 1.5B RM in bf16 on one
rank, about 3 GB of weights and 18 GB of fp32 master weights and moments; on the CPU a few hundred MB/s to GB/s).
benchmarks/rm_guard_cost.py measures it beside a step.

Also here, for the guard's transports: `weights_finite` (every dtype: fp32 has no overflow check in DeepSpeed
0.19.6, so NaN weights would otherwise be published) and `scale_lr` (the response lower_lr).
"""

import copy

import torch

ENGINE_COUNTERS = ("global_steps", "global_samples", "skipped_steps", "micro_steps")


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


def _zero_and_base(engine):
    """(ZeRO optimizer or None, the torch optimizer holding the per-parameter state) of a DeepSpeed engine."""
    zero = getattr(engine, "optimizer", None)
    base = getattr(zero, "optimizer", zero)
    return zero, base


class EngineSnapshot:
    """One rank's copy of an RM's training state (module docstring)."""

    def __init__(self, trainer):
        self.trainer = trainer
        engine = trainer.model
        zero, base = _zero_and_base(engine)
        self.weights = [_cpu(p) for p in engine.module.parameters()]
        self.master = [_cpu(t) for t in getattr(zero, "single_partition_of_fp32_groups", [])]
        self.groups, self.state = [], []
        if base is not None:
            for group in base.param_groups:
                self.groups.append({k: copy.deepcopy(v) for k, v in group.items() if k != "params"})
                self.state.append([{k: _cpu(v) if torch.is_tensor(v) else copy.deepcopy(v)
                                    for k, v in base.state.get(p, {}).items()} for p in group["params"]])
        self.loss_scaler = copy.deepcopy(getattr(zero, "loss_scaler", None))
        scheduler = trainer.scheduler
        self.scheduler = copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None
        self.engine_counters = {name: getattr(engine, name) for name in ENGINE_COUNTERS if hasattr(engine, name)}
        self.counters = copy.deepcopy(trainer.counters)

    @classmethod
    def take(cls, trainer) -> "EngineSnapshot":
        return cls(trainer)

    @torch.no_grad()
    def restore(self) -> None:
        """Put the engine back where it was when the snapshot was taken (in place), gradients cleared."""
        trainer = self.trainer
        engine = trainer.model
        zero, base = _zero_and_base(engine)
        for param, saved in zip(engine.module.parameters(), self.weights):
            param.data.copy_(saved)
        for current, saved in zip(getattr(zero, "single_partition_of_fp32_groups", []), self.master):
            current.data.copy_(saved)
        if base is not None:
            for group, saved_group, saved_states in zip(base.param_groups, self.groups, self.state):
                group.update(copy.deepcopy(saved_group))
                for param, saved in zip(group["params"], saved_states):
                    self._restore_state(base, param, saved)
        if self.loss_scaler is not None:
            zero.loss_scaler = copy.deepcopy(self.loss_scaler)
        if self.scheduler is not None:
            trainer.scheduler.load_state_dict(copy.deepcopy(self.scheduler))
        for name, value in self.engine_counters.items():
            setattr(engine, name, value)
        trainer.counters = copy.deepcopy(self.counters)
        engine.zero_grad()

    @staticmethod
    def _restore_state(base, param, saved: dict) -> None:
        """The optimizer's state of one parameter as saved: tensors copied into the live ones (same device and
        dtype as the optimizer keeps them), entries made since dropped (an update before the first has none)."""
        live = base.state.get(param)
        if not saved:
            base.state.pop(param, None)
            return
        if live is None:
            live = base.state[param] = {}
        for key in [k for k in live if k not in saved]:
            del live[key]
        for key, value in saved.items():
            if torch.is_tensor(value) and torch.is_tensor(live.get(key)) and live[key].shape == value.shape:
                live[key].copy_(value)
            elif torch.is_tensor(value):
                live[key] = value.to(param.device).clone()
            else:
                live[key] = copy.deepcopy(value)


@torch.no_grad()
def weights_finite(module) -> bool:
    """Whether every weight of `module` is finite, whatever its dtype (one device sync per call)."""
    flags = [torch.isfinite(p).all() for p in module.parameters()]
    return bool(torch.stack(flags).all()) if flags else True


def scale_lr(trainer, factor: float) -> float:
    """Multiply the RM's learning rate by `factor` from now on: the scheduler's base rates (what its schedule
    multiplies) and the param groups' current rates. The scheduler's state, base rates included, is checkpointed
    with the engine, so a resumed run keeps the lowered rate. Returns the new current rate."""
    scheduler = trainer.scheduler
    if scheduler is not None and hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
        groups = scheduler.optimizer.param_groups
    else:
        groups = _zero_and_base(trainer.model)[1].param_groups
    for group in groups:
        group["lr"] *= factor
        if "initial_lr" in group:
            group["initial_lr"] *= factor
    return groups[0]["lr"]
