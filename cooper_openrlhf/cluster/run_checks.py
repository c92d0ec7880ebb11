"""What a finished Cooper run's outputs prove, read back from disk: the checks behind `cli/gpu_smoke`'s PASS.

Launch support, run on the CPU after the run (the RM exports are loaded and scored here, never inside a GPU actor).

A run that exits 0 has not necessarily run Cooper's path: with a policy that never answers there are no positives,
no rewrites and no RM update, and every stage still ends well. `cooper_path_problems(run_dir, ckpt_dir)` asks the
run's own logs, in this order, for a step t in which
  pairs      valid pairs were built (`cooper/valid_pair_rate` > 0, tensorboard),
  rewrites   the assistant's rewrites made some of them (`cooper/pairs_from_assistant` > 0),
  RM update  the RM update took a step (`cooper/rm_updated` = 1),
  next step  and the RM saved after step t (its `<tag>_rm_hf` export, --ckpt.save_hf) is the one that paid step t+1:
             it pays step t+1's rollouts what rollouts.jsonl (--cooper.sample_log_dir) says they were paid (within
             `atol`), and step t's rollouts clearly something else (by more than `atol` and twice that difference)
             than they were paid by the RM before the update.
`resumed_rm_problems(run_dir, ckpt_dir, tag, step)` asks it of a resumed run: its first step after `step` was paid
by the RM of checkpoint `tag` (after a best save, `best_global_stepN`).

Rewards are recomputed as the trainer computes them (the RM template, which normalises the completion, the reward
form) on the CPU; `atol` absorbs the dtype difference between that and the run's own scoring. Each function returns a list of
problems, each naming what it read; an empty list is a pass. Reused rows: when a resumed run wrote a step again,
its newest rows and scalars count (as ray/run_logs.py reads them).
"""

from collections.abc import Sequence
from pathlib import Path

import torch

from cooper_openrlhf.algo.rewards import get_reward_form
from cooper_openrlhf.ray.checkpoint_tags import tag_step
from cooper_openrlhf.ray.run_logs import iter_rollouts, read_scalars

PAIRS, FROM_ASSISTANT, RM_UPDATED = "cooper/valid_pair_rate", "cooper/pairs_from_assistant", "cooper/rm_updated"


def newest_rows_by_step(rollouts: Path) -> dict[int, list[dict]]:
    """{step: its rollout rows}; a step written again (a resumed run repeats the steps after its checkpoint) keeps
    the rows of its newest write."""
    by_step: dict[int, list[dict]] = {}
    previous = None
    for row in iter_rollouts(rollouts):
        if row["step"] != previous:
            by_step[row["step"]] = []
            previous = row["step"]
        by_step[row["step"]].append(row)
    return by_step


def rm_rewards(export: Path, rows: Sequence[dict], dtype: torch.dtype, reward_form: str = "continuous",
               threshold: float = 0.5) -> torch.Tensor:
    """(B,) what the RM export pays the rows' completions, computed as the trainer does (`CooperPPOTrainer.rm_rewards`
    without --cooper.require_answer)."""
    from cooper_openrlhf.rm.scorer import RMScorer

    logits = RMScorer.load(str(export), dtype=dtype, batch_size=8).logits(
        [r["question"] for r in rows], [r["reference"] for r in rows],
        [r["completion"] for r in rows])
    return get_reward_form(reward_form)(torch.tensor(logits), threshold)


def _rm_exports(ckpt_dir: Path) -> dict[int, Path]:
    """{step: the RM export saved with that step's checkpoint} (`<tag>_rm_hf`; either tag of a step will do)."""
    exports = {}
    for folder in sorted(ckpt_dir.glob("*_rm_hf")):
        step = tag_step(folder.name[: -len("_rm_hf")])
        if isinstance(step, int):
            exports[step] = folder
    return exports


def _paid_by(export: Path, rows: list[dict], dtype: torch.dtype) -> float:
    """Largest difference between what `export` pays the rows and what the run logged it paid them."""
    logged = torch.tensor([row["reward"] for row in rows])
    return float((rm_rewards(export, rows, dtype) - logged).abs().max())


def cooper_path_problems(run_dir: Path, ckpt_dir: Path, atol: float = 1e-3,
                         dtype: torch.dtype = torch.float32) -> list[str]:
    """Empty when the run shows pairs, rewrites and an RM update at some step t and step t+1 paid by the updated RM
    (module docstring); otherwise what is missing, naming the file or metric read."""
    scalars = read_scalars(Path(run_dir))
    if not scalars:
        return [f"no tensorboard scalars under {run_dir} (--logger.tensorboard_dir)"]
    rollouts = sorted(Path(run_dir).rglob("rollouts.jsonl"))
    if not rollouts:
        return [f"no rollouts.jsonl under {run_dir} (--cooper.sample_log_dir)"]
    pairs = {step for step, value in scalars.get(PAIRS, []) if value > 0}
    rewrites = {step for step, value in scalars.get(FROM_ASSISTANT, []) if value > 0}
    updated = {step for step, value in scalars.get(RM_UPDATED, []) if value == 1.0}
    if not pairs:
        return [f"no step built a valid pair ({PAIRS} = 0 at every step): no positive, or no negative was found"]
    if not rewrites:
        return [f"no valid pair came from an assistant rewrite ({FROM_ASSISTANT} = 0 at steps {sorted(pairs)})"]
    if not updated & pairs:
        return [f"the RM update took no step at the steps with pairs {sorted(pairs)} ({RM_UPDATED} != 1)"]
    rows, exports = newest_rows_by_step(rollouts[-1]), _rm_exports(Path(ckpt_dir))
    candidates = [t for t in sorted(updated & pairs) if t in exports and t + 1 in rows and t in rows]
    if not candidates:
        return [f"no step t with an RM update, its RM export under {ckpt_dir} (--ckpt.save_hf) and rollouts of steps t "
                f"and t+1 in {rollouts[-1]}: updated at {sorted(updated)}, exports of steps {sorted(exports)}, "
                f"rollouts of steps {sorted(rows)}"]
    problems = []
    for t in candidates:
        after = _paid_by(exports[t], rows[t + 1], dtype)
        before = _paid_by(exports[t], rows[t], dtype)
        if after <= atol and before > max(atol, 2 * after):
            return []
        problems.append(f"step {t + 1} was not paid by the RM updated at step {t} ({exports[t]}): it differs from the "
                        f"logged rewards of step {t + 1} by {after:.4f} and of step {t} by {before:.4f} (atol {atol})")
    return problems


def resumed_rm_problems(run_dir: Path, ckpt_dir: Path, tag: str, atol: float = 1e-3,
                        dtype: torch.dtype = torch.float32) -> list[str]:
    """Empty when the step after checkpoint `tag` (the newest rows of step N+1) was paid by the RM saved with it."""
    export = Path(ckpt_dir) / f"{tag}_rm_hf"
    step = tag_step(tag)
    if not export.is_dir():
        return [f"no RM export {export} of the checkpoint the run resumed from (--ckpt.save_hf)"]
    rollouts = sorted(Path(run_dir).rglob("rollouts.jsonl"))
    rows = newest_rows_by_step(rollouts[-1]) if rollouts else {}
    if step + 1 not in rows:
        return [f"no rollouts of step {step + 1} (the first after {tag}) under {run_dir}"]
    difference = _paid_by(export, rows[step + 1], dtype)
    if difference > atol:
        return [f"step {step + 1} after the resume was not paid by the RM of {tag} ({export}): its rewards differ "
                f"by {difference:.4f} (atol {atol})"]
    return []
