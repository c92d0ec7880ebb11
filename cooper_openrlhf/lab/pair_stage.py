"""The starting RM's second stage: Cooper's pair loss on answer pairs, offline; the blindest candidate is kept.

Why. The static arm shows the paper's signature only if its RM has a blind spot the policy can reach: some
wrong output paid more than the policy earns now (lab/rm_probe.py). The lab's BCE recipe does not give one:
MiniLM trained on rule-labelled triples is either flat or compares the answer with the reference and pays text
without an answer like a wrong one. Co-training did give one: a Cooper run's final RM paid the empty completion
almost as much as right answers, after the paper's pairs,
whose positive and negative both carry an answer: the pairwise loss fixes only their difference, so what the RM
pays text with no answer drifts where the updates happen to push it.

What. Starting from the recipe's RM, `steps` updates of `algo.losses.pairwise_rm_loss` -- the Cooper RM update,
at the Cooper arms' RM learning rate and prompts per step -- on pairs of the policy's answer sentence: the
reference answer against a slip of it (the assistant's rewrite, lab/warm_start.py). This is what the RM of a
Cooper run would learn from 40 steps of pairs without the policy moving. Where the answerless pay lands
depends on the seed (some pay answerless text about as much as the truth, others less than answering earns the
warm-started policy), so the lab trains `rm_pair_candidates` seeds (lab/presets.py), probes each and keeps the one that pays the
warm-started policy most for not answering, or for one answer everywhere (`climb_on_offer`): a worst case among
RMs this procedure gives, chosen before any arm runs, and the same RM for every arm. Once the BCE data hold
answerless completions labelled wrong (as in the full preset), blind spots are rarer, and those found are a
constant answer paid about as much as the truth.

`climb_on_offer` and `blindest` are pure; `train_on_pairs` runs torch on the CPU in fp32 (minutes for the full
preset's candidates on 2 cores).
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cooper_openrlhf.algo.answer_style import right_in, wrong_in
from cooper_openrlhf.data.records import MathProblem
from cooper_openrlhf.lab.warm_start import slipped_answer
from cooper_openrlhf.runtime.registry import Registry


@dataclass(frozen=True)
class AnswerPair:
    question: str  # as the RM reads it at RL time: the policy's prompt
    reference: str
    right: str  # the answer sentence with the reference answer (a hedge: the slip stated first)
    wrong: str  # the same sentence with a slip of it (a hedge: its two numbers swapped)


def answer_pairs(problems: Sequence[MathProblem], sentence: str, count: int, rng: random.Random,
                 prompt_suffix: str = "") -> list[AnswerPair]:
    """`count` pairs on problems drawn without replacement (`sentence` has an `{answer}` field)."""
    pairs = []
    for problem in rng.sample(list(problems), count):
        wrong = slipped_answer(int(problem.reference), rng)
        pairs.append(AnswerPair(problem.question + prompt_suffix, problem.reference,
                                right_in(sentence, problem.reference, wrong),
                                wrong_in(sentence, problem.reference, wrong)))
    return pairs


def train_on_pairs(rm_in: str | Path, out: Path, problems: Sequence[MathProblem], sentence: str, *, steps: int,
                   lr: float, pairs_per_step: int, seed: int, prompt_suffix: str = "", max_length: int = 128,
                   other_sentence: tuple[str, float] | None = None) -> dict:
    """`steps` AdamW updates of the RM at `rm_in` on fresh answer pairs; exported to `out`. Returns the last
    step's metrics of the pair loss (loss, pair_accuracy, margin, valid). `other_sentence` (S, share): each step's
    pairs are in S with probability `share` each (the style lab's gates: Cooper's pairs from a policy that writes S
    that often)."""
    import torch

    from cooper_openrlhf.algo.losses import pairwise_rm_loss
    from cooper_openrlhf.rm.model import load_rm, render_and_encode, rm_logits
    from cooper_openrlhf.rm.export import export_rm

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model, tokenizer, template_version = load_rm(str(rm_in))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    metrics: dict = {}
    for _ in range(steps):
        pairs = answer_pairs(problems, sentence, pairs_per_step, rng, prompt_suffix)
        if other_sentence is not None:
            styled = answer_pairs(problems, other_sentence[0], pairs_per_step, rng, prompt_suffix)
            pairs = [b if rng.random() < other_sentence[1] else a for a, b in zip(pairs, styled)]
        questions, references = [p.question for p in pairs] * 2, [p.reference for p in pairs] * 2
        batch = render_and_encode(tokenizer, questions, references, [p.right for p in pairs] + [p.wrong for p in pairs],
                                  max_length, template_version)
        logits = rm_logits(model, batch)
        loss, metrics = pairwise_rm_loss(logits[:len(pairs)], logits[len(pairs):],
                                         torch.ones(len(pairs), dtype=torch.bool))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    export_rm(model.eval(), tokenizer, out, template_version=template_version, max_length=max_length)
    return metrics


def climb_on_offer(probe: dict, accuracy: float) -> float:
    """How much more a policy right on `accuracy` of the prompts earns from the RM of `probe` (a
    `lab.prepare.probe_preset_rm` record) by writing its best-paid text that is the same for every prompt (the
    answerless one, or a constant answer: records before version 3 have none) everywhere than by answering."""
    answering = accuracy * probe["truth_reward"] + (1 - accuracy) * probe["wrong_reward"]
    return max(probe["universal_reward"], probe.get("constant_reward", 0.0)) - answering


def style_climbs(style_probe: dict, canonical_probe: dict, accuracy: float) -> dict:
    """What a style S offers a policy right on `accuracy` of the prompts that answers in the canonical sentence now
    (two `lab.prepare.probe_preset_rm` records of one RM, in S and in the canonical sentence): `constant`, writing S
    with one answer everywhere; `answering`, writing its own answers in S (right as often as now); `canonical`, the
    canonical sentence's own best constant or answerless text (`climb_on_offer`). Each minus what answering in the
    canonical sentence earns; and `premium`, what a wrong answer earns more in S than in the canonical sentence (a
    hedge's wrong answer states the reference first: the exploit a reference-matching RM pays). The style lab's gates
    read `constant` (a planted S) or `premium` (a hedge) against `canonical` (<= 0)."""
    now = accuracy * canonical_probe["truth_reward"] + (1 - accuracy) * canonical_probe["wrong_reward"]
    in_style = accuracy * style_probe["truth_reward"] + (1 - accuracy) * style_probe["wrong_reward"]
    return {"accuracy": accuracy, "constant": round(style_probe["constant_reward"] - now, 4),
            "answering": round(in_style - now, 4), "canonical": round(climb_on_offer(canonical_probe, accuracy), 4),
            "style_right": round(style_probe["truth_reward"], 4), "style_wrong": round(style_probe["wrong_reward"], 4),
            "premium": round(style_probe["wrong_reward"] - canonical_probe["wrong_reward"], 4),
            "style_wrong_above_truth": round(style_probe["kinds"]["wrong"]["above_truth"], 4),
            "canonical_right": round(canonical_probe["truth_reward"], 4),
            "canonical_wrong": round(canonical_probe["wrong_reward"], 4)}


def blindest(probes: Sequence[dict], accuracy: float) -> int:
    """Index of the probe with the largest `climb_on_offer` at `accuracy` (the first of equals)."""
    if not probes:
        raise ValueError("blindest: no candidate RM to choose from")
    climbs = [climb_on_offer(p, accuracy) for p in probes]
    return climbs.index(max(climbs))


# Which candidate the RM arms start from (`--rm-choice`): the blindest (largest climb on offer), the median, or the
# one between them (half-way down the ranks from the blindest to the median): the lab's blind-spot dependence.
CHOICES = Registry("candidate choice", ("blindest", "between", "median"))


def candidate_by_rank(probes: Sequence[dict], accuracy: float, choice: str) -> int:
    """Index of the candidate `choice` names among `probes`, ranked by `climb_on_offer` at `accuracy`, largest
    first (ties: the lower index first). With 32 candidates: blindest rank 0, between rank 7, median rank 15."""
    CHOICES.check(choice)
    if not probes:
        raise ValueError("candidate_by_rank: no candidate RM to choose from")
    climbs = [climb_on_offer(p, accuracy) for p in probes]
    order = sorted(range(len(probes)), key=lambda i: (-climbs[i], i))
    median = (len(probes) - 1) // 2
    return order[{"blindest": 0, "between": median // 2, "median": median}[choice]]
