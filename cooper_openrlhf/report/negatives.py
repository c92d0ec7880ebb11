"""Does a co-trained RM tell the policy's own wrong answers from right ones as well as it tells the rewrites it trains on?

Cooper's RM trains on pairs (a verified-correct rollout, a rewrite of it into a wrong answer). If the rewrites
differ from the policy's own wrong answers in ways the RM can learn instead of correctness, the RM ranks its
training pairs well while it pays the policy's wrong rollouts more and more.
A run's logs hold both sides, scored by the same RM before that step's update: `cooper/rm_pair_accuracy` on the
step's rewrite pairs, and each rollout's reward and verdict (samples/rollouts.jsonl). `rollout_pair_accuracy` is
the RM's accuracy on pairs of the policy's own rollouts: within each prompt's group, every (verified-correct,
verified-wrong) pair, counted right when the correct one is paid more (ties half). Pure; `scripts/
rewrite_vs_rollout_negatives.py` reads the runs.

In the style lab the question is sharper: the exploit is a hedge stating the reference first and a wrong final
answer, and an RM learns to refuse it only from negatives of that form. `style_forms` counts, per step, how many of
Cooper's pairs are hedges and how many negatives have the exploit's form, beside how many of the policy's own
wrong rollouts do (`scripts/style_pair_forms.py` reads the runs).
"""

from collections import defaultdict
from collections.abc import Iterable, Mapping

from cooper_openrlhf.algo.answer_style import in_sentence, is_exploit_form


def rollout_pair_accuracy(rows: Iterable[Mapping]) -> dict[int, tuple[float, int]]:
    """{step: (accuracy, pairs)} over the steps with at least one group holding a right and a wrong rollout.
    rows: rollouts.jsonl records ({"step", "question", "verified", "reward"}); rows without a reward are skipped."""
    groups: dict[tuple[int, str], list[tuple[bool, float]]] = defaultdict(list)
    for row in rows:
        if row.get("reward") is not None:
            groups[(int(row["step"]), row["question"])].append((bool(row["verified"]), float(row["reward"])))
    wins: dict[int, float] = defaultdict(float)
    pairs: dict[int, int] = defaultdict(int)
    for (step, _), members in groups.items():
        right = [r for ok, r in members if ok]
        wrong = [r for ok, r in members if not ok]
        for a in right:
            for b in wrong:
                wins[step] += 1.0 if a > b else 0.5 if a == b else 0.0
                pairs[step] += 1
    return {step: (wins[step] / pairs[step], pairs[step]) for step in sorted(pairs)}


def window_means(by_step: Mapping[int, float], edges: Iterable[tuple[int, int]]) -> list[float | None]:
    """Mean of `by_step`'s values over each inclusive step window (None for a window with none)."""
    out = []
    for low, high in edges:
        values = [v for s, v in by_step.items() if low <= s <= high]
        out.append(sum(values) / len(values) if values else None)
    return out


def style_forms(pairs: Iterable[Mapping], rollouts: Iterable[Mapping], style: str) -> dict[int, dict[str, int]]:
    """{step: counts} of a run's valid pairs (pairs.jsonl: step, reference, positive, negative, valid) and its
    rollouts (rollouts.jsonl: step, reference, completion, verified): "pairs", "positive in S", "negative in S",
    "negative exploit form" (`is_exploit_form`), "wrong rollouts", "wrong rollouts exploit form"."""
    counts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for pair in pairs:
        if pair.get("valid"):
            step = counts[int(pair["step"])]
            step["pairs"] += 1
            step["positive in S"] += in_sentence(pair["positive"], style)
            step["negative in S"] += in_sentence(pair["negative"], style)
            step["negative exploit form"] += is_exploit_form(pair["negative"], style, pair["reference"])
    for row in rollouts:
        if not row["verified"]:
            step = counts[int(row["step"])]
            step["wrong rollouts"] += 1
            step["wrong rollouts exploit form"] += is_exploit_form(row["completion"], style, row["reference"])
    return {step: dict(counts[step]) for step in sorted(counts)}
