"""The pair files some arms train their RM on, written once per lab folder and seed before any run: the
offline_pairs arm's answer pairs, the oracle arm's hedge against its exploit form, and the cooper_stale arm's
Cooper pairs made from the starting policy (lab/arms.py says what each arm asks). lab/prepare.py writes them."""

import json
from pathlib import Path

from cooper_openrlhf.lab.presets import WARM_START, LabPreset
from cooper_openrlhf.lab.task import task_split


def answer_sentence(preset: LabPreset) -> str:
    """The sentence the preset's policy answers in (an `{answer}` field): the warm start's, else a boxed one."""
    from cooper_openrlhf.lab.rm_probe import BOXED_SENTENCE
    from cooper_openrlhf.lab.warm_start import ANSWER_SENTENCE

    return ANSWER_SENTENCE if preset.policy == WARM_START else BOXED_SENTENCE


OFFLINE_STEPS_SPARE = 8  # groups beyond the step budget, so a run never cycles back to its first pairs


def write_offline_pairs(preset: LabPreset, path: Path, seed: int) -> int:
    """The offline_pairs arm's pairs for one seed (algo/offline_pairs.py's file): `prompts_per_step` answer pairs of
    the pair stage's kind (`pair_stage.answer_pairs`: the policy's answer sentence, the reference answer against a
    slip of it) on train problems per step, fresh each step, from a stream of their own (not a candidate's)."""
    import random

    from cooper_openrlhf.lab.pair_stage import answer_pairs

    train, _ = task_split(preset.task)
    rng, rows = random.Random(f"offline pairs {seed}"), []
    for step in range(preset.steps + OFFLINE_STEPS_SPARE):
        for pair in answer_pairs(train, answer_sentence(preset), preset.prompts_per_step, rng,
                                 preset.task.prompt_suffix):
            rows.append({"step": step, "question": pair.question, "reference": pair.reference,
                         "positive": pair.right, "negative": pair.wrong})
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    tmp.replace(path)
    return len(rows)


def write_oracle_pairs(preset: LabPreset, path: Path, seed: int) -> int:
    """The oracle arm's pairs for one seed: harvested from logged rollouts when the preset names them
    (`oracle_rollouts`: `write_harvested_oracle_pairs`), else the style's hedge. The hedge: `prompts_per_step` pairs
    per step on train problems, each the style's
    hedge right (a slip first, the reference last) against its exploit form (the reference first, the slip last),
    fresh each step from a stream of the seed's own; on every other pair (at random) both carry the fragment
    the style lab's policies came to append (`rm.probes.TAIL`), so the RM is shown the exploit as a policy writes it,
    tail or not. The positive carries the fragment whenever the negative does: the pair teaches where the
    reference stands, not that a tail is wrong."""
    import random

    from cooper_openrlhf.algo.answer_style import is_hedge
    from cooper_openrlhf.lab.pair_stage import answer_pairs
    from cooper_openrlhf.rm.probes import TAIL

    if preset.oracle_rollouts:
        return write_harvested_oracle_pairs(preset, path, seed)
    if not preset.style or not is_hedge(preset.style):
        raise ValueError(f"the oracle arm's pairs are a hedge against its exploit form (the preset's style must be a "
                         f"hedge, an {{other}} and an {{answer}} field, not {preset.style!r}), or harvested from "
                         f"logged rollouts (--oracle-rollouts)")
    train, _ = task_split(preset.task)
    rng, rows = random.Random(f"oracle pairs {seed}"), []
    for step in range(preset.steps + OFFLINE_STEPS_SPARE):
        for pair in answer_pairs(train, preset.style, preset.prompts_per_step, rng, preset.task.prompt_suffix):
            tail = TAIL if rng.random() < 0.5 else ""
            rows.append({"step": step, "question": pair.question, "reference": pair.reference,
                         "positive": pair.right + tail, "negative": pair.wrong + tail})
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    tmp.replace(path)
    return len(rows)


def harvest_oracle_pairs(rows: list[dict], steps: int, per_step: int, rng) -> list[dict]:
    """Pure: the oracle's pairs from graded rollouts (each row: question, reference, completion, verified). Per
    (question, reference) with both kinds, its right completions and its exploits (verified wrong, stating the
    reference: `algo.answer_style.is_exploit`, the class a reference-matching RM pays); per step `per_step` such
    problems drawn at random, each a right completion against an exploit, drawn at random (distinct texts)."""
    from cooper_openrlhf.algo.answer_style import is_exploit

    kinds: dict[tuple[str, str], tuple[set, set]] = {}
    for row in rows:
        right, exploit = kinds.setdefault((row["question"], str(row["reference"])), (set(), set()))
        completion = row["completion"].strip()
        if row["verified"]:
            right.add(completion)
        elif is_exploit(completion, str(row["reference"]), False):
            exploit.add(completion)
    usable = sorted(key for key, (right, exploit) in kinds.items() if right and exploit)
    if not usable:
        return []
    pairs = []
    for step in range(steps):
        for question, reference in rng.sample(usable, min(per_step, len(usable))):
            right, exploit = kinds[(question, reference)]
            pairs.append({"step": step, "question": question, "reference": reference,
                          "positive": rng.choice(sorted(right)), "negative": rng.choice(sorted(exploit))})
    return pairs


def logged_rollouts(sources) -> list[dict]:
    """The rows of every samples/rollouts.jsonl under `sources` (run or lab folders, a rollouts.jsonl file, or a run
    archive .tar.gz as `lab.batch.archive_run` writes it), each graded again by this checkout's rule verifier (the
    trainer's default answer fallback) so that a hole fixed since the run does not make an exploit a positive."""
    import tarfile

    from cooper_openrlhf.verify.rule import RuleVerifierConfig, Verdict, verify_one

    texts = []
    for source in map(Path, sources):
        if source.is_dir():
            texts += [p.read_text(encoding="utf-8") for p in sorted(source.rglob("samples/rollouts.jsonl"))]
        elif source.name.endswith(".tar.gz"):
            with tarfile.open(source) as tar:
                texts += [tar.extractfile(m).read().decode("utf-8") for m in tar.getmembers()
                          if m.isfile() and m.name.endswith("samples/rollouts.jsonl")]
        elif source.is_file():
            texts.append(source.read_text(encoding="utf-8"))
        else:
            raise FileNotFoundError(f"--oracle-rollouts {source}: no such file or folder")
    config, rows = RuleVerifierConfig(answer_fallback="none"), []
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                row = json.loads(line)
                row["verified"] = verify_one(str(row["reference"]), row["completion"], config).verdict == Verdict.CORRECT
                rows.append(row)
    return rows


def write_harvested_oracle_pairs(preset: LabPreset, path: Path, seed: int) -> int:
    """The oracle arm's pairs harvested from `preset.oracle_rollouts` (`harvest_oracle_pairs`): the exploit as a
    policy wrote it, for a policy whose answers no style describes. Fails naming the sources when they hold no
    problem with both a right completion and an exploit."""
    import random

    rows = logged_rollouts(preset.oracle_rollouts)
    pairs = harvest_oracle_pairs(rows, preset.steps + OFFLINE_STEPS_SPARE, preset.prompts_per_step,
                                 random.Random(f"oracle pairs {seed}"))
    if not pairs:
        raise ValueError(f"--oracle-rollouts {', '.join(preset.oracle_rollouts)}: {len(rows)} logged rollouts and no "
                         "problem with both a right completion and an exploit (wrong, stating the reference)")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in pairs), encoding="utf-8")
    tmp.replace(path)
    return len(pairs)


def has_pair_source(preset: LabPreset) -> bool:
    """Whether the lab writes pairs of the pair stage's kind (the offline_pairs and cooper_stale arms' files, the
    offline continuation): from its own recipe's RM (not `--rm`), with a pair stage or in the style lab."""
    return not preset.starting_rm and (preset.rm_pair_steps > 0 or preset.style is not None)


def write_stale_pairs(preset: LabPreset, policy: Path, path: Path, seed: int) -> dict:
    """The cooper_stale arm's pairs for one seed: Cooper's pairs as its first step would make them, made from the
    *starting* policy for every step before the run. Per step, `prompts_per_step` train problems (a stream of the
    seed's own); per problem `samples_per_prompt` sampled rollouts at the RL temperature; the first verified-correct
    one is the positive (`algo.selection.select_positives`) and the policy's own reply to Cooper's rewrite prompt
    for it the negative, kept when the verifier proves its answer different (the strict rule). Returns counts."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cooper_openrlhf.algo.negatives import build_rewrite_messages
    from cooper_openrlhf.lab.warm_start import _sample, answer_example
    from cooper_openrlhf.verify.rule import Verdict, verify_one

    if path.is_file():  # sampled once: a resume keeps the pairs the seed's first runs trained on
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return {"pairs": len(rows), "steps": len({r["step"] for r in rows}), "in_style": sum(r["in_style"] for r in rows)}
    from cooper_openrlhf.algo.answer_style import in_sentence

    train, _ = task_split(preset.task)
    tokenizer = AutoTokenizer.from_pretrained(str(policy))
    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32).eval()
    rng, rows, n = random.Random(f"stale pairs {seed}"), [], preset.samples_per_prompt
    suffix = preset.task.prompt_suffix
    for step in range(preset.steps + OFFLINE_STEPS_SPARE):
        problems = rng.sample(list(train), preset.prompts_per_step)
        texts = _sample(model, tokenizer, [answer_example(p, suffix)[0] for p in problems], n, preset.temperature,
                        preset.max_new_tokens, seed=seed * 100_003 + step)
        positives = []
        for i, problem in enumerate(problems):
            right = [t for t in texts[i * n:(i + 1) * n]
                     if verify_one(problem.reference, t).verdict == Verdict.CORRECT]
            if right:
                positives.append((problem, right[0].strip()))
        if not positives:
            continue
        chats = [build_rewrite_messages(p.question + suffix, positive, p.reference) for p, positive in positives]
        negatives = _sample(model, tokenizer, chats, 1, 1.0, 32, seed=seed * 100_003 + 50_000 + step)
        for (problem, positive), negative in zip(positives, negatives):
            if verify_one(problem.reference, negative).verdict == Verdict.INCORRECT:
                rows.append({"step": step, "question": problem.question + suffix, "reference": problem.reference,
                             "positive": positive, "negative": negative.strip(),
                             "in_style": bool(preset.style) and in_sentence(positive, preset.style)})
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    tmp.replace(path)
    return {"pairs": len(rows), "steps": len({r["step"] for r in rows}), "in_style": sum(r["in_style"] for r in rows)}
