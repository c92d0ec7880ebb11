"""The lab's shared starting point, built once per lab folder and reused by every arm, seed and resume.

  data/      the task files (lab/task.py), rewritten each time (deterministic, so identical)
  policy/    the warm-started tiny policy (lab/warm_start.py), or nothing when --policy names a model
  verifyrm/  the starting VerifyRM, trained by the package's own recipe tool (`cli.verifyrm train`, BCE on
             rule-labelled triples) into verifyrm/best, then (rm_pair_steps > 0) given Cooper's pair loss on
             answer pairs from several seeds into verifyrm/pairs/seed<k>, of which verifyrm/pairs/chosen.json
             names the one every RM arm starts from (lab/pair_stage.py); `--rm` gives one instead.
             verifyrm/probe.json: what a policy maximising the starting RM would write (lab/rm_probe.py)
A stage that finished leaves its marker (policy/warm_start.json, verifyrm/train_summary.json,
verifyrm/pairs/seed<k>.json, verifyrm/pairs/chosen.json) and is skipped on a resume; an unfinished one is redone.
"""

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from cooper_openrlhf.lab.arm_pairs import (answer_sentence, has_pair_source, write_offline_pairs, write_oracle_pairs,
                                            write_stale_pairs)
from cooper_openrlhf.lab.arms import ARMS
from cooper_openrlhf.lab.presets import WARM_START, LabPreset
from cooper_openrlhf.lab.reading import LOW_START
from cooper_openrlhf.lab.runner import LabFiles, run_environment
from cooper_openrlhf.lab.task import task_split, warm_start_problems, write_task_files

logger = logging.getLogger(__name__)


def _resolve_model(name: str) -> Path:
    from cooper_openrlhf.models import model_path

    return Path(name) if Path(name).is_dir() else Path(model_path(name))


def split_accuracies(model, tokenizer, preset: LabPreset) -> dict[str, float]:
    """A policy's sampled accuracy on 64 train-split problems and on the held-out split, at the RL temperature (as
    the arms' first rollouts and evaluations are sampled)."""
    from cooper_openrlhf.lab.warm_start import sampled_accuracy

    train, heldout = task_split(preset.task)
    return {name: sampled_accuracy(model, tokenizer, problems, preset.task.prompt_suffix, temperature=preset.temperature)
            for name, problems in (("train_accuracy", train[:64]), ("heldout_accuracy", heldout))}


def prepare_policy(preset: LabPreset, folder: Path) -> tuple[Path, dict]:
    """The policy every arm starts from, and what is known of it (warm-start accuracy)."""
    if preset.policy != WARM_START:
        return _resolve_model(preset.policy), {"policy": preset.policy}
    marker = folder / "warm_start.json"
    if marker.is_file():
        return folder, json.loads(marker.read_text(encoding="utf-8"))
    from cooper_openrlhf.lab.warm_start import (
        WarmStartConfig,
        fine_tune,
        sampled_rewrite_style,
        sampled_rewrite_validity,
        sampled_style_share,
        save,
    )
    from cooper_openrlhf.runtime.dtype import torch_dtype

    started = time.perf_counter()
    config = WarmStartConfig(target_accuracy=preset.warm_start_accuracy, temperature=preset.temperature,
                             style=preset.style, style_share=preset.style_share, seed=preset.preparation_seed)
    logger.info("warm start: fine-tuning the tiny policy on the %s family until its sampled accuracy reaches %.2f",
                preset.task.family, config.target_accuracy)
    model, tokenizer, result = fine_tune(str(_resolve_model("tiny-qwen2-policy")), warm_start_problems(preset.task),
                                         config, preset.task.prompt_suffix)
    if not result.reached_target:
        logger.warning("warm start: accuracy %.2f after %d steps, below the target %.2f; the arms start from it",
                       result.probe_accuracy, result.steps, config.target_accuracy)
    train = task_split(preset.task)[0]
    info = {
        "policy": WARM_START, **asdict(config), **asdict(result), **split_accuracies(model, tokenizer, preset),
        # As the assistant: the share of its rewrite attempts that are valid negatives.
        "rewrite_validity": sampled_rewrite_validity(model, tokenizer, train[:32], preset.task.prompt_suffix),
        # The style lab: how often it answers in S, and whether its rewrites of S answers stay in S.
        **({"style_answers": sampled_style_share(model, tokenizer, train[:64], preset.style,
                                                 preset.task.prompt_suffix),
            "rewrite_style": sampled_rewrite_style(model, tokenizer, train[:32], preset.style,
                                                   preset.task.prompt_suffix)} if preset.style else {}),
        "seconds": round(time.perf_counter() - started, 1),
    }
    save(model, tokenizer, folder, torch_dtype("auto"))
    marker.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    logger.info("warm start done: sampled accuracy %.2f (train split), %.2f (held-out)", info["train_accuracy"],
                info["heldout_accuracy"])
    if info["heldout_accuracy"] < LOW_START:
        logger.warning("warm start: held-out accuracy %.2f on problems it never saw in any form: a fall can hardly "
                       "show on them; the lab's last lines read the training rollouts' verified accuracy too",
                       info["heldout_accuracy"])
    return folder, info


def prepare_rm(preset: LabPreset, data: Path, folder: Path) -> Path:
    """Train the starting VerifyRM with `cli.verifyrm train` (skipped when it finished before, or given)."""
    if preset.starting_rm:
        return Path(preset.starting_rm)
    if (folder / "train_summary.json").is_file() and (folder / "best").is_dir():
        return folder / "best"
    argv = bce_stage_argv(preset, data, folder)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder.parent / f"{folder.name}.log"
    logger.info("starting VerifyRM: verifyrm train --model.model_name_or_path %s (log %s)", argv[5], log)
    from cooper_openrlhf.lab.progress import bce_stage_update, polling, step_bar

    line = step_bar("preparation: starting RM, BCE stage", None)  # its total once the stage has counted its steps
    with open(log, "w", encoding="utf-8") as out, polling(bce_stage_update(folder, log, line)):
        status = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=bce_stage_environment()).returncode
    line.close()
    if status != 0:
        raise RuntimeError(f"training the starting VerifyRM failed (exit {status}); its log: {log}")
    return folder / "best"


def bce_stage_argv(preset: LabPreset, data: Path, folder: Path, epochs: int | None = None) -> list[str]:
    """The BCE stage's command: `cli.verifyrm train` on the lab's labelled triples."""
    return [sys.executable, "-m", "cooper_openrlhf.cli.verifyrm", "train",
            "--model.model_name_or_path", str(_resolve_model(preset.rm_backbone)),
            *(("--init-head",) if preset.rm_init_head else ()), "--data.dataset", str(data),
            "--ckpt.output_dir", str(folder), "--train.max_epochs", str(epochs or preset.rm_epochs),
            "--adam.lr", str(preset.rm_lr_pretrain), "--data.max_len", str(preset.rm_max_length),
            "--ds.zero_stage", "0", "--train.batch_size", "16", "--train.micro_batch_size", "8",
            *(("--train.seed", str(BCE_SEED + preset.preparation_seed)) if preset.preparation_seed else ())]


BCE_SEED = 42  # OpenRLHF's default --train.seed: the BCE stage of preparation 0 passes none
# Pair-stage candidate k of preparation p trains from seed k + p * PAIR_SEED_STRIDE (p = 0: seed k, as before):
# far enough apart that no two preparations share a candidate's seed.
PAIR_SEED_STRIDE = 1000


def bce_stage_environment() -> dict[str, str]:
    """Nothing else of the lab runs during its preparation, so the BCE stage gets every core: an arm's processes keep
    to one thread each (run_environment) because runs go side by side, which would leave a core idle here. A thread
    count the user set is kept (`benchmarks/bce_stage_threads.py` measures the difference)."""
    return {**os.environ, **{k: v for k, v in run_environment().items() if k != "OMP_NUM_THREADS"}}


def prepare_pair_stage(preset: LabPreset, bce_rm: Path, folder: Path, policy_accuracy: float) -> tuple[Path, dict]:
    """lab/pair_stage.py: `rm_pair_candidates` seeds of the pair stage from `bce_rm`, each probed; the starting RM
    is the candidate with the largest climb on offer to a policy right on `policy_accuracy` of the prompts, or the
    preset's `rm_pair_candidate` where it names one."""
    from cooper_openrlhf.lab.pair_stage import candidate_by_rank, climb_on_offer, train_on_pairs

    choice = preset.rm_pair_choice if preset.rm_pair_candidate is None else "given"
    chosen = folder / "chosen.json"
    cached = json.loads(chosen.read_text(encoding="utf-8")) if chosen.is_file() else None
    # A folder prepared with another choice, or fewer candidates (copied in to share them), keeps them, trains
    # the missing ones and chooses again. A record written before candidates were recorded lists none: taken as is.
    searched = len(cached["candidates"]) if cached and cached.get("candidates") else None
    if cached and cached.get("choice", "blindest") == choice and preset.rm_pair_candidate in (None, cached["seed"]) \
            and searched in (None, preset.rm_pair_candidates):
        return folder / f"seed{cached['seed']}", cached
    folder.mkdir(parents=True, exist_ok=True)
    train, _ = task_split(preset.task)
    candidates = []
    for seed in tqdm(range(preset.rm_pair_candidates), desc="preparation: starting RM, pair-stage candidates",
                     unit="RM", dynamic_ncols=True):
        marker = folder / f"seed{seed}.json"
        if not marker.is_file():
            metrics = train_on_pairs(bce_rm, folder / f"seed{seed}", train, answer_sentence(preset),
                                     steps=preset.rm_pair_steps, lr=preset.rm_pair_lr,
                                     pairs_per_step=preset.prompts_per_step,
                                     seed=seed + PAIR_SEED_STRIDE * preset.preparation_seed,
                                     prompt_suffix=preset.task.prompt_suffix, max_length=preset.rm_max_length)
            marker.write_text(json.dumps({"seed": seed, "last_step": metrics}, indent=2) + "\n", encoding="utf-8")
        candidate = json.loads(marker.read_text(encoding="utf-8"))
        if not probe_is_current(candidate.get("probe"), preset, folder / f"seed{seed}"):  # trained once, probed anew
            candidate["probe"] = probe_preset_rm(preset, folder / f"seed{seed}")
            marker.write_text(json.dumps(candidate, indent=2) + "\n", encoding="utf-8")
        candidates.append(candidate)
    best = preset.rm_pair_candidate if choice == "given" else \
        candidate_by_rank([c["probe"] for c in candidates], policy_accuracy, choice)
    record = {"seed": best, "choice": choice, "policy_accuracy": policy_accuracy, "bce_rm": str(bce_rm),
              "bce_probe": cached["bce_probe"] if cached else probe_preset_rm(preset, bce_rm),
              "candidates": [{"seed": c["seed"], "climb": round(climb_on_offer(c["probe"], policy_accuracy), 4),
                              "verdict": c["probe"]["verdict"]} for c in candidates]}
    chosen.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    logger.info("starting RM: pair-stage seed %d of %d (%s), climb on offer %.3f at accuracy %.2f", best,
                len(candidates), choice, record["candidates"][best]["climb"], policy_accuracy)
    return folder / f"seed{best}", record


def offline_continuation(preset: LabPreset, rm: Path, folder: Path) -> dict:
    """The starting RM after as many more pair-stage steps as an arm has RL steps, with no policy at all (does a
    blind spot wash out by training alone?), and its probe (what `cli.probe_rm` prints); cached in `folder`.json."""
    from cooper_openrlhf.lab.pair_stage import train_on_pairs

    marker = folder.with_suffix(".json")
    if marker.is_file():
        record = json.loads(marker.read_text(encoding="utf-8"))
        if record.get("from") == str(rm) and probe_is_current(record.get("probe"), preset, folder):
            return record
    train, _ = task_split(preset.task)
    seed = 1000  # not a candidate's seed: fresh pairs
    metrics = train_on_pairs(rm, folder, train, answer_sentence(preset), steps=preset.steps, lr=preset.rm_pair_lr,
                             pairs_per_step=preset.prompts_per_step, seed=seed, prompt_suffix=preset.task.prompt_suffix,
                             max_length=preset.rm_max_length)
    record = {"from": str(rm), "rm": str(folder), "steps": preset.steps, "seed": seed, "last_step": metrics,
              "probe": probe_preset_rm(preset, folder),
              "command": f"python -m cooper_openrlhf.cli.probe_rm {folder} --preset {preset.name}"}
    marker.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    logger.info("offline continuation (%d more pair-stage steps, no policy): %s", preset.steps,
                record["probe"]["verdict"])
    return record


# A cached probe of another version is redone (1 had no break-even accuracy, 2 no constant answers), as is
# one made with the other format gate.
PROBE_VERSION = 3


def probe_preset_rm(preset: LabPreset, rm: str | Path, sentence: str | None = None) -> dict:
    """lab/rm_probe.py on the preset's RL prompts, in its policy's answer sentence (or `sentence`: the style lab's S)
    -> a JSON-able record."""
    from cooper_openrlhf.lab.rm_probe import probe_rm

    sentence = sentence or answer_sentence(preset)
    train, _ = task_split(preset.task)
    probe = probe_rm(str(rm), train, sentence, prompt_suffix=preset.task.prompt_suffix,
                     require_answer=preset.require_answer)
    return {"version": PROBE_VERSION, "rm": str(rm), "sentence": sentence, "require_answer": preset.require_answer,
            **asdict(probe), "verdict": probe.verdict()}


def style_record(preset: LabPreset, rm: Path, canonical_probe: dict, accuracy: float) -> dict:
    """The style lab's probe of an RM: what S pays (`probe_preset_rm` in S) and the climbs it offers a policy right on
    `accuracy` of the prompts (lab/pair_stage.py `style_climbs`)."""
    from cooper_openrlhf.lab.pair_stage import style_climbs

    style_probe = probe_preset_rm(preset, rm, preset.style)
    return {"probe": style_probe, **style_climbs(style_probe, canonical_probe, accuracy)}


def probe_is_current(record: dict | None, preset: LabPreset, rm: str | Path) -> bool:
    """Whether a stored probe record is what `probe_preset_rm(preset, rm)` would give now."""
    return bool(record) and record.get("version") == PROBE_VERSION and record.get("rm") == str(rm) \
        and record.get("require_answer", False) == preset.require_answer


def probe_starting_rm(preset: LabPreset, rm: Path, cached: Path, known: dict | None = None) -> dict:
    """`probe_preset_rm` of the lab's starting RM, cached in `cached` (verifyrm/probe.json); `known` is a probe
    of `rm` already made (the pair stage probes every candidate), used instead of probing again."""
    stored = json.loads(cached.read_text(encoding="utf-8")) if cached.is_file() else None
    usable = [r for r in (stored, known) if probe_is_current(r, preset, rm)]
    record = usable[0] if usable else probe_preset_rm(preset, rm)
    cached.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


class NoVerifierError(RuntimeError):
    """The BCE-trained starting RM is no verifier and the lab was asked to require one (`--require-verifier`)."""


def prepare(preset: LabPreset, root: Path, require_verifier: bool = False) -> tuple[LabFiles, dict]:
    """Data, policy and RM of the lab folder `root`; returns the shared files and a record for the report. A lab
    whose arms are all paid by the rule prepares no RM (no BCE stage, pair stage or probe). `require_verifier`:
    raise NoVerifierError, before the pair stage, when `starting_rm_problem` finds one."""
    counts = write_task_files(root / "data", preset.task, preset.prompts_per_step * preset.steps,
                              answerless_rm_data=preset.rm_answerless_data, balanced_rm_data=preset.rm_balanced_data,
                              rm_eval_rows=preset.rm_eval_rows, style=preset.style, poison_style=preset.poison_style)
    policy, policy_info = prepare_policy(preset, root / "policy")
    if not any(ARMS[arm].reward == "rm" for arm in preset.arms):  # e.g. a rule-reward baseline on a new task
        return LabFiles(root=root, policy=policy, rm=None), {"data": counts, "policy": policy_info, "rm": {}}
    rm = prepare_rm(preset, root / "data" / "rm_triples.jsonl", root / "verifyrm")
    known_probe = None
    if preset.starting_rm:
        rm_summary = {"given": preset.starting_rm}
    else:
        rm_summary = json.loads((rm.parent / "train_summary.json").read_text(encoding="utf-8"))
        rm_summary["quality"] = rm_eval_quality(rm, root / "data" / "rm_eval.jsonl", preset.rm_max_length)
        logger.info("starting VerifyRM (BCE stage) on its held-out triples: %s", rm_summary["quality"])
        problem = starting_rm_problem(rm_summary["quality"])
        if problem and require_verifier:
            raise NoVerifierError(f"{problem} Stopped before the pair stage and the arms (--require-verifier); "
                                  f"the BCE stage's log: {root / 'verifyrm.log'}")
        if problem:
            logger.warning(problem)
        if preset.rm_pair_steps > 0:
            accuracy = policy_info.get("train_accuracy", preset.warm_start_accuracy)
            rm, rm_summary["pair_stage"] = prepare_pair_stage(preset, rm, root / "verifyrm" / "pairs", accuracy)
            known_probe = json.loads(rm.with_suffix(".json").read_text(encoding="utf-8"))["probe"]
    (root / "verifyrm").mkdir(parents=True, exist_ok=True)
    probe = probe_starting_rm(preset, rm, root / "verifyrm" / "probe.json", known_probe)
    if has_pair_source(preset):
        for seed in range(preset.seeds):  # deterministic: rewritten on every invocation, as the task files are
            write_offline_pairs(preset, root / "data" / f"offline_pairs_seed{seed}.jsonl", seed)
    if "oracle" in preset.arms:  # the style's hedge (a preset with a pair source) or harvested rollouts (any)
        for seed in range(preset.seeds):
            write_oracle_pairs(preset, root / "data" / f"oracle_pairs_seed{seed}.jsonl", seed)
    if has_pair_source(preset):
        if "cooper_stale" in preset.arms:
            stale = {seed: write_stale_pairs(preset, policy, root / "data" / f"stale_pairs_seed{seed}.jsonl", seed)
                     for seed in range(preset.seeds)}
            rm_summary["stale_pairs"] = {str(seed): counts for seed, counts in stale.items()}
        if preset.offline_continuation:
            rm_summary["offline_continuation"] = offline_continuation(preset, rm,
                                                                      root / "verifyrm" / "offline_continuation")
    if preset.style is not None:  # what S offers the policy, from the starting RM and after the offline continuation
        accuracy = policy_info.get("train_accuracy", preset.warm_start_accuracy)
        rm_summary["style"] = style_record(preset, rm, probe, accuracy)
        if "offline_continuation" in rm_summary:
            after = root / "verifyrm" / "offline_continuation"
            rm_summary["offline_continuation"]["style"] = style_record(
                preset, after, rm_summary["offline_continuation"]["probe"], accuracy)
    logger.info("starting VerifyRM probe: %s", probe["verdict"])
    return LabFiles(root=root, policy=policy, rm=rm), {"data": counts, "policy": policy_info, "rm": rm_summary,
                                                       "rm_probe": probe}


AUC_FLOOR = 0.6  # an RM whose held-out ROC-AUC is below this barely ranks right above wrong, whatever its threshold


def roc_auc(labels: list[bool], scores: list[float]) -> float | None:
    """The probability that a random right row scores above a random wrong one (ties count half); None without
    both classes. O(n^2) on the lab's few hundred rows."""
    right = [s for s, y in zip(scores, labels) if y]
    wrong = [s for s, y in zip(scores, labels) if not y]
    if not right or not wrong:
        return None
    wins = sum((r > w) + 0.5 * (r == w) for r in right for w in wrong)
    return wins / (len(right) * len(wrong))


def verifier_quality(labels: list[bool], scores: list[float], threshold: float = 0.0) -> dict:
    """What an RM's logits `scores` say of rows with gold `labels`: accuracy at `threshold` (logit 0 = reward 0.5),
    the majority-class rate (the accuracy of a constant RM), and ROC-AUC (ranking, whatever the threshold)."""
    if len(labels) != len(scores) or not labels:
        raise ValueError(f"need as many labels as scores, and some: {len(labels)} vs {len(scores)}")
    accuracy = sum((s >= threshold) == bool(y) for s, y in zip(scores, labels)) / len(labels)
    right_share = sum(map(bool, labels)) / len(labels)
    return {"n": len(labels), "accuracy": accuracy, "majority_rate": max(right_share, 1 - right_share),
            "auc": roc_auc([bool(y) for y in labels], scores)}


def rm_eval_quality(rm: str | Path, rm_eval: Path, max_length: int) -> dict:
    """`verifier_quality` of the RM at `rm` on the lab's labelled held-out triples (data/rm_eval.jsonl)."""
    from cooper_openrlhf.rm.scorer import RMScorer

    rows = [json.loads(line) for line in rm_eval.read_text(encoding="utf-8").splitlines() if line.strip()]
    logits = RMScorer.load(str(rm), max_length=max_length, batch_size=32).logits(
        [r["question"] for r in rows], [r["answer"] for r in rows], [r["completion"] for r in rows])
    return verifier_quality([r["gold_correct"] for r in rows], logits)


CHANCE_MARGIN = 0.05  # an RM within this of the majority-class rate tells right from wrong by luck


def starting_rm_problem(quality: dict) -> str | None:
    """A warning when the starting VerifyRM is no verifier on its held-out triples, else None: its accuracy within
    CHANCE_MARGIN of the majority-class rate (a constant RM's; 0.5 only on balanced rows), or its ROC-AUC below
    AUC_FLOOR (it does not rank right completions above wrong ones).

    Such an RM pays every completion about the same, so the static and Cooper arms train on noise-level rewards
    and the lab compares nothing (an RM that pays every completion 0.5; or, on unbalanced rows, a constant at the
    majority rate, which a check against 0.5 lets pass). The arms still run: a flat RM is a legitimate (harsh) starting point, but the reader must
    know.
    """
    accuracy, majority, auc = quality.get("accuracy"), quality.get("majority_rate", 0.5), quality.get("auc")
    if accuracy is None:
        return None
    near_majority = accuracy - majority <= CHANCE_MARGIN
    low_auc = auc is not None and auc < AUC_FLOOR
    if not (near_majority or low_auc):
        return None
    return (f"the starting VerifyRM is no verifier on its held-out triples (accuracy {accuracy:.3f} on "
            f"{quality.get('n', '?')} rows against the majority-class rate {majority:.3f}; ROC-AUC "
            f"{'-' if auc is None else f'{auc:.3f}'}): the static and Cooper arms will train on noise-level rewards. "
            "Lower its learning rate or train it longer (the preset's rm_lr_pretrain, rm_epochs: at too high a "
            "rate MiniLM's BCE stage stays a constant) to compare the arms.")
