"""What a run's policy wrote over a window of steps, from its rollout log (`samples/rollouts.jsonl`, or the
held-out evaluations' `samples/heldout.jsonl`).

A window's most common rollouts, their mean RM reward, the verified share, what right and wrong rollouts were
paid, the highest-paid ones, the most common wrong ones and what each was paid:
`cooper inspect rollouts RUN_DIR... --steps 38-40`.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from cooper_openrlhf.algo.answer_style import in_sentence
from cooper_openrlhf.runtime.registry import Registry

# Per-step series a report derives from the rollout log when it is given the lab's answer style S (`style_series`).
STYLE_SHARE = "style/share"  # share of the step's rollouts written in S
STYLE_EXPLOIT = "style/exploit_rate"  # share written in S and verified wrong: a policy exploiting the blind spot


@dataclass
class RolloutWindow:
    first: int
    last: int
    rollouts: int
    mean_reward: float | None  # None: no rollout of the window carries a reward (held-out rows without an RM)
    verified: float  # share of the window's rollouts the rule verifier marked correct
    reward_verified: float | None  # mean reward of the verified ones (None: there were none)
    reward_unverified: float | None
    common: list[tuple[str, int]]  # the most common completions, with their counts
    best_paid: list[tuple[str, float, bool]]  # the highest-rewarded rollouts: completion, reward, verified
    # The most common completions the verifier marked wrong, with their counts and mean reward: what a blind spot
    # pays (a text may be right on some prompts and wrong on others, so `common` alone does not say it).
    common_wrong: list[tuple[str, int, float | None]]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def rollout_window(rows: Iterable[dict], first: int, last: int, top: int = 3) -> RolloutWindow:
    """Pure: rollout rows (step, completion, verified, reward) -> their summary over steps first..last."""
    window = [row for row in rows if first <= row["step"] <= last]
    if not window:
        raise ValueError(f"no rollout logged at steps {first}-{last}")
    paid = [row for row in window if row["reward"] is not None]  # held-out rows of a run without an RM: None
    best = sorted(paid, key=lambda row: -row["reward"])[:top]
    return RolloutWindow(
        first, last, len(window), _mean([row["reward"] for row in paid]),
        sum(row["verified"] for row in window) / len(window),
        _mean([row["reward"] for row in paid if row["verified"]]),
        _mean([row["reward"] for row in paid if not row["verified"]]),
        Counter(row["completion"] for row in window).most_common(top),
        [(row["completion"], row["reward"], row["verified"]) for row in best],
        [(text, count, _mean([row["reward"] for row in paid if row["completion"] == text and not row["verified"]]))
         for text, count in Counter(row["completion"] for row in window if not row["verified"]).most_common(top)])


def style_series(rows: Iterable[dict], style: str) -> dict[str, list[tuple[int, float]]]:
    """Pure: rollout rows (step, completion, verified) -> {STYLE_SHARE: [(step, share)], STYLE_EXPLOIT: [...]}, one
    point per logged step. The exploit rate over a window of equal-sized steps is the plan's measure
    (report/registered_measures.py `exploit_rate`), drawn step by step."""
    counts: dict[int, list[int]] = {}  # step -> [rollouts, in S, in S and wrong]
    for row in rows:
        count = counts.setdefault(row["step"], [0, 0, 0])
        styled = in_sentence(row["completion"], style)
        count[0] += 1
        count[1] += styled
        count[2] += styled and not row["verified"]
    steps = sorted(counts)
    return {STYLE_SHARE: [(step, counts[step][1] / counts[step][0]) for step in steps],
            STYLE_EXPLOIT: [(step, counts[step][2] / counts[step][0]) for step in steps]}


EXPORT_FORMATS = Registry("export format", ("recipe", "verifybench"))


def rollout_triples(rows: Iterable[dict], first: int, last: int, fmt: str = "recipe", source: str = "") -> list[dict]:
    """Pure: the rollouts of steps first..last as labelled triples, the label being the rule verifier's verdict the
    run logged (`verified`). fmt "recipe": the VerifyRM recipe's rows (question, reference, completion, label),
    what `verifyrm train` reads; "verifybench": VerifyBench rows (question, answer, completion, gold_correct),
    what `cli.eval_verifier` reads. So an RM can be trained on, or measured against, what a policy really
    writes rather than templates. A row without its text fails naming the step."""
    EXPORT_FORMATS.check(fmt)
    triples = []
    for row in rows:
        if not first <= row["step"] <= last:
            continue
        missing = [key for key in ("question", "reference", "completion") if not isinstance(row.get(key), str)]
        if missing:
            raise ValueError(f"the rollout at step {row['step']} has no text field {missing[0]!r}")
        if fmt == "recipe":
            triple = {"question": row["question"], "reference": row["reference"], "completion": row["completion"],
                      "label": int(row["verified"])}
        else:
            triple = {"question": row["question"], "answer": row["reference"], "completion": row["completion"],
                      "gold_correct": bool(row["verified"])}
        triples.append({**triple, "source": source, "step": row["step"]})
    return triples
