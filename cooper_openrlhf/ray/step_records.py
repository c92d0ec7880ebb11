"""What one Cooper step carries between its phases, and how it is recorded (no Ray: imported by the trainer).

PendingPairs: the step's texts (`core.RolloutTexts`) and its pair plan while the assistant's rewrites are under way.
StepClock: each stage's span and seconds (`timeline/*`, `timing/cooper_*`). StepState: what the weight sync needs of
the step in flight. prompt_question_map / raw_question: the raw question behind each of OpenRLHF's rendered prompts.
merge_rm_metrics: one step's RM metrics from its (mini-batch) updates. rollout_rows / pair_rows / append_jsonl: the
rollout, held-out and pair logs of --cooper.sample_log_dir.
"""

import json
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass

from openrlhf.datasets.prompts_dataset import preprocess_data
from openrlhf.datasets.utils import blending_datasets

from cooper_openrlhf.algo.pairs import PairBatch
from cooper_openrlhf.algo.selection import NegativePlan
from cooper_openrlhf.core.rollouts import RolloutTexts


@dataclass
class PendingPairs:
    """A step's pair plan while the assistant's rewrites are under way (built by the trainer's `request_negatives`)."""

    texts: RolloutTexts
    plan: NegativePlan  # positives, rollout-negative candidates, the prompts the assistant rewrites
    rewrites: Future  # -> (prompt -> rewrite, the assistant's metrics), collected on the trainer's second thread
    step: int  # the global step (seeds the rewrites and the random rollout-negative pick)


class StepClock:
    """Each stage of one step, timed by one context manager, `stage(name)`:

    timeline/<name>_start|_end   the stage's span, in seconds from the step's start (every stage)
    timing/cooper_<name>         its seconds, for the stages the step itself waits through (OpenRLHF sums its
                                 timing/* keys into `timing/step_total`); `timing_key=False` for work beside the
                                 step (its own time is logged by the actor doing it) or time an OpenRLHF key counts.
    Safe to use from the trainer's second thread. A stage that raises is still timed.
    """

    def __init__(self):
        self.origin = time.perf_counter()
        self.spans: dict[str, tuple[float, float]] = {}
        self.timed: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, timing_key: bool = True):
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.spans[name] = (start - self.origin, end - self.origin)
            if timing_key:
                self.timed[name] = self.timed.get(name, 0.0) + end - start

    def metrics(self) -> dict[str, float]:
        spans = {f"timeline/{stage}_{edge}": value for stage, (start, end) in self.spans.items()
                 for edge, value in (("start", start), ("end", end))}
        return {**spans, **{f"timing/cooper_{stage}": seconds for stage, seconds in self.timed.items()}}


@dataclass
class StepState:
    """What this trainer's `broadcast_to_vllm`, reached inside OpenRLHF's `train_step`, needs of the step in flight."""

    clock: StepClock  # the step's stages
    rewrites: Future | None  # the assistant's rewrites (None: none asked): the engines take new weights after them


def raw_question(row: dict, input_key: str) -> str:
    """The question text of a prompt-dataset row: the input_key string, or the last user turn of a chat."""
    value = row[input_key]
    if isinstance(value, list):
        turns = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        value = turns[-1] if turns else None
    if not isinstance(value, str):
        raise ValueError(f"field {input_key!r} holds {type(value).__name__}, not question text or a chat with a user turn")
    return value


def prompt_question_map(args, strategy, tokenizer) -> dict[str, str]:
    """Rendered prompt (what OpenRLHF's PromptDataset hands the trainer) -> raw question, over the same data:
    --data.prompt_dataset and, when given, --eval.dataset (the held-out rollouts are scored by the RM too).

    Loads each exactly as `openrlhf.trainer.ppo_trainer.prepare_datasets` does and renders each row with
    OpenRLHF's own `preprocess_data`, so the keys are the trainer's prompts byte for byte.
    """
    chat = tokenizer.apply_chat_template if args.data.apply_chat_template else None
    sources = [("prompt dataset", blending_datasets(args.data.prompt_dataset, args.data.prompt_probs, strategy,
                                                    args.train.seed, max_count=args.data.max_samples,
                                                    dataset_split=args.data.prompt_split))]
    if getattr(args.eval, "dataset", None):
        sources.append(("eval dataset", blending_datasets(args.eval.dataset, None, strategy,
                                                          dataset_split=args.eval.split)))
    questions: dict[str, str] = {}
    for name, data in sources:
        for index, row in enumerate(data):
            prompt, _ = preprocess_data(row, args.data.input_template, args.data.input_key, args.data.label_key, chat)
            question = raw_question(row, args.data.input_key)
            if questions.setdefault(prompt, question) != question:
                raise ValueError(f"{name} row {index}: two different questions render to the same prompt {prompt!r}")
    return questions

def heldout_problems(args, strategy) -> list:
    """--eval.dataset's rows as `MathProblem`s (raw question, label), in file order: the RM's probe suite is built on
    problems the policy never trains on. Empty without --eval.dataset."""
    from cooper_openrlhf.data.records import MathProblem

    if not getattr(args.eval, "dataset", None):
        return []
    data = blending_datasets(args.eval.dataset, None, strategy, dataset_split=args.eval.split)
    return [MathProblem(raw_question(row, args.data.input_key), str(row[args.data.label_key]), "eval.dataset", index)
            for index, row in enumerate(data)]


def merge_rm_metrics(calls: list[dict[str, float]]) -> dict[str, float]:
    """One step's RM metrics from its `fit` calls (one per optimizer-step group, in order; see launch_rm_update).

    Per-pair means are weighted by the pairs of each call (each measured before that call's update); counts
    add up; optimizer steps, learning rate and gradient norm are the last call's.
    """
    if len(calls) == 1:
        return dict(calls[0])
    merged = dict(calls[-1])
    weighted = {"cooper/rm_loss": "cooper/rm_valid_pairs", "cooper/rm_pair_accuracy": "cooper/rm_valid_pairs",
                "cooper/rm_margin": "cooper/rm_valid_pairs", "cooper/rm_loss_last_pass": "cooper/rm_valid_pairs",
                "cooper/rm_pair_accuracy_assistant": "cooper/rm_pairs_assistant",
                "cooper/rm_pair_accuracy_rollout": "cooper/rm_pairs_rollout"}
    for key, weight in weighted.items():
        parts = [(call[key], call[weight]) for call in calls if key in call and call.get(weight)]
        if parts:
            merged[key] = sum(value * count for value, count in parts) / sum(count for _, count in parts)
    for key in ("cooper/rm_valid_pairs", "cooper/rm_pairs_assistant", "cooper/rm_pairs_rollout",
                "cooper/rm_steps_skipped", "cooper/rm_fit_seconds"):
        if any(key in call for call in calls):
            merged[key] = sum(call.get(key, 0.0) for call in calls)
    merged["cooper/rm_updated"] = max(call.get("cooper/rm_updated", 0.0) for call in calls)
    if any("cooper/rm_rank_weight_spread" in call for call in calls):
        merged["cooper/rm_rank_weight_spread"] = max(call.get("cooper/rm_rank_weight_spread", 0.0) for call in calls)
    return merged


def append_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
        handle.flush()


def rollout_rows(step: int, texts: RolloutTexts, verified, rewards: list[float] | None) -> list[dict]:
    """One JSON row per rollout for --cooper.sample_log_dir (rewards None: the run has no RM to score them)."""
    rewards = rewards if rewards is not None else [None] * len(verified)
    return [{"step": step, "question": q, "reference": r, "completion": c, "verified": bool(v),
             "reward": None if w is None else float(w)}
            for q, r, c, v, w in zip(texts.questions, texts.references, texts.completions, verified, rewards)]


def pair_rows(step: int, pairs: PairBatch) -> list[dict]:
    """One JSON row per prompt's pair slot (valid or not) for --cooper.sample_log_dir."""
    return [{"step": step, "question": q, "reference": r, "positive": p, "negative": n, "valid": v,
             "positive_index": i, "negative_source": k}
            for q, r, p, n, v, i, k in zip(pairs.questions, pairs.references, pairs.positives, pairs.negatives,
                                           pairs.valid, pairs.positive_index, pairs.negative_source)]
