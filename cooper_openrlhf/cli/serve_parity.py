"""Learning parity: a `train_cooper` run's rollouts replayed through the reward service's learner.

`cooper serve-parity --samples RUN/samples --rm-checkpoints RUN/ckpt/_rm [cli.serve flags]`

The trainer (`ray/trainer.py` + `ray/reward_actor.py`) and the service (`serve/learner.py`) both train the RM with
`rm.pairwise_update`; this shows they learn the same thing from the same rollouts. It reads the rollouts the run
logged per step (`--cooper.sample_log_dir`: rollouts.jsonl, in the trainer's batch order), sends each step's
samples to an in-process `RewardService` built by `serve.build.build_service` from the given flags (with `--learn`:
the learner `cli.serve` builds, starting from the same `--rm`), one single-sample request each, all at once, as
OpenRLHF's client sends them; a trainer step's groups are one service step. After each step it compares, with the
trainer's records of that step:
  scores   the reward the service paid each sample with the reward the trainer logged, and that the RM version of
           step t's groups is the trainer's RM after step t-1 (the trainer scores step t with the RM updated at t-1):
           the number of steps before t whose RM update changed the trainer's weights, since a step without a
           valid pair (or one the guard rolled back) publishes no new version;
  verdicts the rule verifier's "correct" per sample;
  pairs    the pair slots the learner built (positive, negative, validity per prompt) with pairs.jsonl;
  schedule the learning rate, scheduler steps and optimizer steps of the service's engine and the trainer's;
  weights  the service's RM weights with the RM of the trainer's DeepSpeed checkpoint `_rm/global_step{t}`
           (`--ckpt.save_steps 1`): max |difference| and ||difference|| / ||trainer's update of that step||; and
           ZeRO's fp32 master weights (in a bf16 run the module's weights are their rounding).
The service's flags must say what the run's did (docs/serve.md, "Parity with the trainer", has the mapping). Exits 1
when a step differs beyond the tolerances.
"""

import argparse
import asyncio
import json
import logging
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# Tolerances for fp32 on CPU. Scores: the trainer scores in batches of --cooper.rm_score_batch_size, the
# service in batches of whatever arrived together, so padding and matmul shapes differ: ~1e-7 per logit. Weights:
# the update itself runs the same chunks in the same order, but thread counts (the run's workers have
# OMP_NUM_THREADS=1) change summation order, ~1e-7 relative per op, growing through Adam's division by sqrt(v).
SCORE_ATOL = 1e-4  # on the paid reward sigmoid(logit)
WEIGHT_ATOL = 1e-5  # max |w_service - w_trainer| over every RM weight
UPDATE_RTOL = 1e-3  # ||w_service - w_trainer|| / ||w_trainer(t) - w_trainer(t-1)||


@dataclass
class StepParity:
    """What the replay of one trainer step found."""

    step: int
    samples: int
    score_max_abs: float  # max |reward paid by the service - reward the trainer logged|
    verdict_mismatches: int  # samples whose "correct" differs
    pair_mismatches: list[str]  # one line per differing pair slot
    weight_max_abs: float  # max |w_service - w_trainer|
    weight_rel_update: float  # ||w_service - w_trainer|| / ||trainer's update this step|| (nan: no update)
    update_norm: float  # ||w_trainer(t) - w_trainer(t-1)||
    master_max_abs: float  # max |difference| of ZeRO's fp32 master weights (what bf16 weights are rounded from)
    versions: list[int]  # the RM versions that scored the step's samples
    trainer_version: int  # the trainer's RM after step t-1: how many earlier steps changed its weights
    schedule: dict = field(default_factory=dict)  # name -> (service, trainer)

    def problems(self) -> list[str]:
        found = [f"step {self.step}: {line}" for line in self.pair_mismatches]
        if self.score_max_abs > SCORE_ATOL:
            found.append(f"step {self.step}: rewards differ by up to {self.score_max_abs:.3g} (> {SCORE_ATOL})")
        if self.versions != [self.trainer_version]:
            found.append(f"step {self.step}: scored by RM versions {self.versions}, the trainer's by the RM after "
                         f"{self.trainer_version} updates")
        if self.verdict_mismatches:
            found.append(f"step {self.step}: {self.verdict_mismatches} verdicts differ")
        if self.weight_max_abs > WEIGHT_ATOL:
            found.append(f"step {self.step}: weights differ by up to {self.weight_max_abs:.3g} (> {WEIGHT_ATOL})")
        if self.master_max_abs > WEIGHT_ATOL:
            found.append(f"step {self.step}: fp32 master weights differ by up to {self.master_max_abs:.3g} "
                         f"(> {WEIGHT_ATOL})")
        if self.weight_rel_update > UPDATE_RTOL:
            found.append(f"step {self.step}: the weight difference is {self.weight_rel_update:.3g} of the step's "
                         f"update (> {UPDATE_RTOL})")
        for name, (mine, theirs) in self.schedule.items():
            if not math.isclose(mine, theirs, rel_tol=1e-6, abs_tol=1e-12):
                found.append(f"step {self.step}: {name} is {mine} in the service, {theirs} in the trainer")
        return found


def read_jsonl_by_step(path: Path) -> dict[int, list[dict]]:
    """step -> that step's rows, in file order (the trainer's batch order)."""
    steps: dict[int, list[dict]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], []).append(row)
    return steps


def trainer_checkpoint(rm_checkpoints: Path, step: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict]:
    """(RM weights, fp32 master weights, schedule) of the trainer's DeepSpeed checkpoint `global_step{step}`
    (`reward_actor.save_checkpoint`; one data-parallel rank).

    Weights: the engine's module state dict as DeepSpeed saved it (ZeRO 1/2 keep whole weights), in the run's dtype.
    Master weights: ZeRO's flat fp32 partitions, one per parameter group, concatenated. Schedule: the learning rate
    of the next step, the scheduler's step count and the optimizer steps taken."""
    folder = rm_checkpoints / f"global_step{step}"
    (model_file,) = folder.glob("mp_rank_00_model_states.pt")
    (optim_file,) = folder.glob("*zero_pp_rank_0_mp_rank_00_optim_states.pt")
    states = torch.load(model_file, map_location="cpu", weights_only=False)
    weights = {name: tensor.float() for name, tensor in states["module"].items()}
    optim = torch.load(optim_file, map_location="cpu", weights_only=False)["optimizer_state_dict"]
    master = torch.cat([part.float() for part in optim["single_partition_of_fp32_groups"]])
    schedule = {"lr": float(states["lr_scheduler"]["_last_lr"][0]),
                "scheduler_steps": float(states["lr_scheduler"]["last_epoch"]),
                "optimizer_steps": float(states["cooper_rm_counters"]["optimizer_steps"])}
    return weights, master, schedule


def service_schedule(trainer) -> dict[str, float]:
    """The same three numbers of the service's learner (`rm.pairwise_update.RMTrainer`)."""
    return {"lr": float(trainer.scheduler.get_last_lr()[0]), "scheduler_steps": float(trainer.scheduler.last_epoch),
            "optimizer_steps": float(trainer.counters["optimizer_steps"])}


def weight_difference(mine: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor],
                      before: dict[str, torch.Tensor]) -> tuple[float, float, float]:
    """(max |mine - theirs|, ||mine - theirs|| / ||theirs - before||, ||theirs - before||) over every weight."""
    if mine.keys() != theirs.keys():
        raise ValueError(f"the service's and the trainer's RMs name different weights: "
                         f"{sorted(mine.keys() ^ theirs.keys())[:5]}")
    max_abs, diff_sq, update_sq = 0.0, 0.0, 0.0
    for name, weight in theirs.items():
        diff = mine[name].float() - weight
        max_abs = max(max_abs, float(diff.abs().max()))
        diff_sq += float(diff.double().square().sum())
        update_sq += float((weight - before[name]).double().square().sum())
    update = math.sqrt(update_sq)
    return max_abs, (math.sqrt(diff_sq) / update if update else math.nan), update


def pair_differences(built, logged: list[dict]) -> list[str]:
    """One line per pair slot where the service's PairBatch and the trainer's pairs.jsonl rows differ."""
    if len(built) != len(logged):
        return [f"{len(built)} pair slots in the service, {len(logged)} in the trainer"]
    lines = []
    for slot, row in enumerate(logged):
        mine = {"question": built.questions[slot], "positive": built.positives[slot],
                "negative": built.negatives[slot], "valid": bool(built.valid[slot]),
                "negative_source": built.negative_source[slot]}
        for key, value in mine.items():
            if value != row[key]:
                lines.append(f"prompt {slot}: {key} {value!r:.80} in the service, {row[key]!r:.80} in the trainer")
    return lines


def recording_pairs(learner) -> list:
    """Make `learner` keep every step's PairBatch (returned list, one per step): the replay reads the pairs the
    learner trained on, so it wraps the learner's own `pairs_of` instead of building pairs a second way."""
    kept = []
    pairs_of = learner.pairs_of

    def pairs_and_record(*args, **kwargs):
        pairs, metrics = pairs_of(*args, **kwargs)
        kept.append(pairs)
        return pairs, metrics

    learner.pairs_of = pairs_and_record
    return kept


def compare_step(step: int, rows: list[dict], answers: list, built, logged_pairs: list[dict], learner,
                 rm_checkpoints: Path, before: dict[str, torch.Tensor],
                 trainer_version: int) -> tuple[StepParity, dict[str, torch.Tensor]]:
    """The service after its step `step` against the trainer's records of that step; also returns the
    trainer's weights of the step (the next step's `before`).

    rows: the step's logged rollouts; answers: the service's `Scored` per row; built: the learner's PairBatch;
    trainer_version: how many earlier steps changed the trainer's RM."""
    paid = torch.tensor([answer.reward for answer in answers])
    logged = torch.tensor([row["reward"] for row in rows])
    verdicts = sum((answer.verdict.value == "correct") != row["verified"] for answer, row in zip(answers, rows))
    weights, master, schedule = trainer_checkpoint(rm_checkpoints, step)
    trainer = learner.trainer
    mine = {name: t.detach().float() for name, t in trainer.model.module.state_dict().items()}
    max_abs, rel_update, update = weight_difference(mine, weights, before)
    my_master = torch.cat([part.detach().float() for part in trainer.optim.single_partition_of_fp32_groups])
    mine_schedule = service_schedule(trainer)
    result = StepParity(step, len(rows), float((paid - logged).abs().max()), verdicts,
                        pair_differences(built, logged_pairs), max_abs, rel_update, update,
                        float((my_master - master).abs().max()), sorted({answer.version for answer in answers}),
                        trainer_version, {key: (mine_schedule[key], schedule[key]) for key in schedule})
    logger.info("step %d: %d samples, rewards max |diff| %.3g, %d verdicts differ, %d pair slots differ; weights max "
                "|diff| %.3g, ||diff|| / ||update|| %.3g (||update|| %.3g), fp32 master max |diff| %.3g; lr %s / %s",
                step, len(rows), result.score_max_abs, verdicts, len(result.pair_mismatches), max_abs, rel_update,
                update, result.master_max_abs, mine_schedule["lr"], schedule["lr"])
    return result, weights


async def replay(args, rollouts: dict[int, list[dict]], pairs: dict[int, list[dict]],
                 rm_checkpoints: Path) -> list[StepParity]:
    """Replay every logged step through a service built from `args` (cli.serve's namespace); see the module doc."""
    from cooper_openrlhf.serve.build import build_service
    from cooper_openrlhf.serve.protocol import Sample
    from cooper_openrlhf.serve.published_names import STEPS_COUNTER

    service, _ = build_service(args)
    learner = service.learner
    built = recording_pairs(learner)
    before = {name: t.detach().float().clone() for name, t in learner.trainer.model.module.state_dict().items()}
    await service.start()
    found = []
    try:
        for step in sorted(rollouts):
            rows = rollouts[step]
            # The question is the group key too: the trainer's templated prompt is not logged, and is one per question.
            samples = [Sample(r["question"], r["question"], r["reference"], r["completion"]) for r in rows]
            answers = await asyncio.gather(*(service.score([sample]) for sample in samples))
            while service.counters[STEPS_COUNTER] < len(found) + 1 or not service.update_done.is_set():
                await asyncio.sleep(0.05)
            if service.last_step.get("cooper/rm_update_failed"):
                raise RuntimeError(f"step {step}: the service's RM update failed (traceback above)")
            trainer_version = sum(earlier.update_norm > 0 for earlier in found)
            result, before = compare_step(step, rows, [answer for (answer,) in answers], built[-1],
                                          pairs.get(step, []), learner, rm_checkpoints, before, trainer_version)
            found.append(result)
    finally:
        await service.stop(save=False)
        for pool in service.verifier_pools:
            pool.close()
        learner.pair_builder.close()
    return found


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cooper serve-parity", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False,  # else cli.serve's --rm would be read as --rm-checkpoints
                                epilog="Every other flag is cli.serve's (--rm, --group-size, --groups-per-update, "
                                       "--seed, --rm-lr, ...); --learn, --no-chat-template and a --state-dir are "
                                       "added.")
    p.add_argument("--samples", required=True, type=Path, help="the run's --cooper.sample_log_dir")
    p.add_argument("--rm-checkpoints", required=True, type=Path, help="the run's {--ckpt.path}/_rm")
    p.add_argument("--report", type=Path, default=None, help="write the per-step results here as JSON")
    return p


def serve_args(serve_argv: list[str], state_dir: str):
    """cli.serve's namespace for the replay: the given flags plus learning on, no chat template (the replay sends
    the raw questions) and a fresh state dir; the same checks `cli.serve` runs."""
    from cooper_openrlhf.cli.serve import build_parser as serve_parser, check_args

    args = serve_parser().parse_args(["--learn", "--no-chat-template", "--state-dir", state_dir, *serve_argv])
    problems = check_args(args)
    if problems:
        raise SystemExit("error: " + "; ".join(problems))
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    own, serve_argv = build_parser().parse_known_args(argv)
    from cooper_openrlhf.runtime import install_cpu_runtime

    install_cpu_runtime()
    rollouts = read_jsonl_by_step(own.samples / "rollouts.jsonl")
    pairs = read_jsonl_by_step(own.samples / "pairs.jsonl")
    with tempfile.TemporaryDirectory(prefix="serve_parity_") as state_dir:
        found = asyncio.run(replay(serve_args(serve_argv, state_dir), rollouts, pairs, own.rm_checkpoints))
    if own.report:
        own.report.write_text(json.dumps([vars(step) for step in found], indent=1))
    problems = [line for step in found for line in step.problems()]
    for line in problems:
        logger.error("%s", line)
    logger.info("%d steps replayed: %s", len(found), "parity" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
