"""What one Cooper step carries between its phases, and how it is recorded (no Ray: imported by the trainer).

RolloutTexts / PendingPairs: the step's texts and its pairs while the assistant's rewrites are under way.
prompt_question_map / raw_question: the raw question behind each of OpenRLHF's rendered prompts.
StepTimeline: each stage's span, for `timing/cooper_*` and `timeline/*`. merge_rm_metrics: one step's RM
metrics from its (mini-batch) updates. append_jsonl: the rollout and pair logs of --cooper.sample_log_dir.
"""

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass

from openrlhf.datasets.prompts_dataset import preprocess_data
from openrlhf.datasets.utils import blending_datasets


@dataclass
class RolloutTexts:
    """What the verifier, the assistant and the RM read of one step's rollouts (B = prompts * n, prompt-grouped)."""

    questions: list[str]  # (B,) raw question of the rollout's prompt (the dataset's input_key text)
    references: list[str]  # (B,) reference answer (the dataset's label_key value, as text)
    completions: list[str]  # (B,) the policy's response, decoded without special tokens


@dataclass
class PendingPairs:
    """A step's pairs while its assistant rewrites are under way (built by `request_negatives`)."""

    texts: RolloutTexts
    verdicts: object  # ray.pair_builder.RolloutVerdicts
    positive_index: list[int]  # (P,)
    has_wrong_rollout: list[bool]  # (P,)
    rewrites: object  # ObjectRef of (prompt -> rewrite, metrics), or that value itself once collected
    requested_at: float  # perf_counter when the rewrites were requested
    step: int
    woke_engines: bool


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


class StepTimeline:
    """Start and end of each stage of one step, in seconds from the step's start (`timeline/*` metrics)."""

    def __init__(self):
        self.origin = time.perf_counter()
        self.spans: dict[str, tuple[float, float]] = {}

    def record(self, stage: str, start: float, end: float) -> None:
        self.spans[stage] = (start - self.origin, end - self.origin)

    @contextmanager
    def stage(self, metrics: dict, name: str):
        """Times the block as `timing/cooper_<name>` (OpenRLHF's per-stage key) and as a timeline span."""
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            metrics[f"timing/cooper_{name}"] = metrics.get(f"timing/cooper_{name}", 0.0) + end - start
            self.record(name, start, end)

    def metrics(self) -> dict[str, float]:
        return {f"timeline/{stage}_{edge}": value for stage, (start, end) in self.spans.items()
                for edge, value in (("start", start), ("end", end))}


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
