"""The CooperTrainer's pure helpers: recovering raw questions from OpenRLHF's rendered prompts, pair and batch splits."""

import json

import pytest

from cooper_openrlhf.algo.pairs import PairBatch, distinct, even_slices
from cooper_openrlhf.ray.step_records import StepClock, merge_rm_metrics, prompt_question_map, raw_question


def test_rendered_prompts_map_back_to_the_raw_question_exactly_as_openrlhf_renders_them(tmp_path, model_dir):
    from openrlhf.datasets import PromptDataset
    from openrlhf.datasets.utils import blending_datasets
    from openrlhf.utils import get_strategy
    from transformers import AutoTokenizer

    from cooper_openrlhf.runtime.openrlhf_args import parse_openrlhf_args

    rows = [
        {"question": "What is 2 + 3?", "label": "5"},
        {"question": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6 * 7?"}],
         "label": "42"},
    ]
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    args_list = ["--data.prompt_dataset", str(data), "--data.input_key", "question", "--data.label_key", "label",
                 "--data.apply_chat_template"]
    args = parse_openrlhf_args(args_list)
    strategy = get_strategy(args)
    tokenizer = AutoTokenizer.from_pretrained(model_dir("tiny-qwen2-policy"))

    questions = prompt_question_map(args, strategy, tokenizer)
    # The keys are what the trainer receives: OpenRLHF's own PromptDataset over the same file.
    rendered = PromptDataset(blending_datasets(str(data), None, strategy), tokenizer, strategy).prompts
    assert [questions[prompt] for prompt in rendered] == ["What is 2 + 3?", "What is 6 * 7?"]
    assert all("<|im_start|>" in prompt for prompt in rendered)  # the policy's chat text never is the question

    # With --eval.dataset the held-out prompts map too (the RM scores held-out rollouts).
    held_out = tmp_path / "heldout.jsonl"
    held_out.write_text(json.dumps({"question": "What is 9 - 4?", "label": "4"}) + "\n")
    with_eval = parse_openrlhf_args([*args_list, "--eval.dataset", str(held_out)])
    questions = prompt_question_map(with_eval, get_strategy(with_eval), tokenizer)
    (held_out_prompt,) = PromptDataset(blending_datasets(str(held_out), None, strategy), tokenizer, strategy).prompts
    assert questions[held_out_prompt] == "What is 9 - 4?" and len(questions) == 3


def test_raw_question_takes_the_last_user_turn_and_rejects_other_shapes():
    chat = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "Q?"}]
    assert raw_question({"q": chat}, "q") == "Q?"
    assert raw_question({"q": "plain"}, "q") == "plain"
    with pytest.raises(ValueError, match="not question text"):
        raw_question({"q": [{"role": "system", "content": "only a system turn"}]}, "q")


def test_valid_pairs_keeps_the_valid_slots_in_order():
    pairs = PairBatch(["q0", "q1", "q2"], ["r0", "r1", "r2"], ["p0", "", "p2"], ["n0", "", "n2"], [True, False, True],
                      [0, -1, 9], ["rollout", "", "assistant"])
    kept = pairs.valid_only()
    assert (kept.questions, kept.positives, kept.negatives, kept.positive_index) == (["q0", "q2"], ["p0", "p2"],
                                                                                   ["n0", "n2"], [0, 9])
    assert kept.negative_source == ["rollout", "assistant"]
    assert kept.num_valid == len(kept) == 2


def test_even_slices_cover_the_batch_with_sizes_differing_by_at_most_one():
    slices = even_slices(7, 3)
    assert [(s.start, s.stop) for s in slices] == [(0, 3), (3, 5), (5, 7)]
    assert [(s.start, s.stop) for s in even_slices(1, 2)] == [(0, 1), (1, 1)]
    pairs = PairBatch(list("abcde"), list("abcde"), list("abcde"), list("abcde"), [True] * 5, list(range(5)),
                      ["assistant"] * 5)
    assert [part.questions for part in pairs.split(3)] == [["a", "b"], ["c", "d"], ["e"]]


def test_distinct_keeps_first_seen_order_and_maps_every_item_back():
    items = [("q", "1"), ("q", "2"), ("q", "1"), ("p", "1"), ("q", "2")]
    unique, inverse = distinct(items)
    assert unique == [("q", "1"), ("q", "2"), ("p", "1")] and inverse == [0, 1, 0, 2, 1]
    assert [unique[i] for i in inverse] == items
    assert distinct([]) == ([], [])


def test_step_clock_records_stage_spans_and_timing_keys_even_when_a_stage_raises():
    clock = StepClock()
    with clock.stage("verify"):
        pass
    with pytest.raises(RuntimeError), clock.stage("score"):
        raise RuntimeError("boom")
    with clock.stage("rewrites", timing_key=False):  # work beside the step: a span, not a step-total key
        pass
    metrics = clock.metrics()
    assert metrics["timing/cooper_verify"] >= 0 and "timing/cooper_score" in metrics
    assert 0 <= metrics["timeline/verify_start"] <= metrics["timeline/verify_end"] <= metrics["timeline/score_start"]
    assert metrics["timeline/score_end"] >= metrics["timeline/score_start"]
    assert "timeline/rewrites_end" in metrics and "timing/cooper_rewrites" not in metrics


def test_rm_metrics_of_several_minibatch_updates_are_weighted_by_their_pairs():
    first = {"cooper/rm_loss": 0.7, "cooper/rm_pair_accuracy": 0.5, "cooper/rm_valid_pairs": 2.0, "cooper/rm_updated": 1.0,
             "cooper/rm_optimizer_steps": 1.0, "cooper/rm_pairs_rollout": 2.0, "cooper/rm_pair_accuracy_rollout": 0.5,
             "cooper/rm_fit_seconds": 1.0}
    second = {"cooper/rm_loss": 0.4, "cooper/rm_pair_accuracy": 1.0, "cooper/rm_valid_pairs": 6.0, "cooper/rm_updated": 1.0,
              "cooper/rm_optimizer_steps": 2.0, "cooper/rm_pairs_rollout": 0.0, "cooper/rm_fit_seconds": 2.0}
    merged = merge_rm_metrics([first, second])
    assert merged["cooper/rm_loss"] == pytest.approx((0.7 * 2 + 0.4 * 6) / 8)
    assert merged["cooper/rm_pair_accuracy"] == pytest.approx((0.5 * 2 + 6) / 8)
    assert merged["cooper/rm_pair_accuracy_rollout"] == pytest.approx(0.5)  # only the first had rollout pairs
    assert merged["cooper/rm_valid_pairs"] == 8.0 and merged["cooper/rm_fit_seconds"] == 3.0
    assert merged["cooper/rm_optimizer_steps"] == 2.0
    assert merge_rm_metrics([first]) == first


@pytest.mark.parametrize("trainable", [False, True])
def test_the_rms_eval_set_is_scored_once_for_a_frozen_rm_and_at_every_evaluation_for_a_trained_one(trainable):
    """A static arm's RM never changes, so its accuracy on --cooper.rm_eval_dataset is scored once and logged at
    every evaluation; a co-trained RM changes every step and is scored every time."""
    from types import SimpleNamespace

    import torch

    from cooper_openrlhf.ray.evaluation import HeldOutEvaluation

    class Trainer(HeldOutEvaluation):
        def __init__(self):
            self.rm_trainable, self.calls = trainable, 0
            self.rm_eval_rows = [SimpleNamespace(question="q", reference="1", completion=c, gold_correct=g)
                                 for c, g in (("1", True), ("2", False), ("3", False))]

        def rm_logits(self, texts):
            self.calls += 1
            return torch.tensor([2.0, -2.0, 2.0 if self.calls == 1 else -2.0])  # the RM learns between calls

    trainer = Trainer()
    first, second = trainer.rm_eval_accuracy(), trainer.rm_eval_accuracy()
    assert first == pytest.approx(2 / 3)
    assert (trainer.calls, second) == ((2, 1.0) if trainable else (1, first))


@pytest.mark.parametrize("trainable", [False, True])
def test_the_probe_suite_is_scored_once_for_a_frozen_rm_and_at_every_evaluation_for_a_trained_one(trainable):
    """The same for the probe suite: a frozen RM's probe logits are scored once (a static arm read them at each of
    its evaluations, each time the same, for about as long as its steps took); the pay is formed again each time."""
    import torch

    from cooper_openrlhf.data.records import MathProblem
    from cooper_openrlhf.ray.evaluation import HeldOutEvaluation
    from cooper_openrlhf.rm.probes import build_probes

    probes, dropped = build_probes([MathProblem(question="What is 2 + 3?", reference="5", source="t", index=0)], 1)

    class Trainer(HeldOutEvaluation):
        def __init__(self):
            self.rm_trainable, self.calls = trainable, 0
            self.probes, self.probes_dropped = probes, dropped

        def rm_logits(self, texts):
            self.calls += 1
            return torch.full((len(texts.completions),), 2.0 if self.calls == 1 else -2.0)  # the RM moves

        def rm_rewards(self, logits, answerless):
            return torch.sigmoid(logits)

    trainer = Trainer()
    first, second = trainer.probe_rm(), trainer.probe_rm()
    assert first and all(0.0 <= v <= 1.0 for k, v in first.items() if "probe_pay" in k)
    assert trainer.calls == (2 if trainable else 1)
    assert (second != first) if trainable else (second == first)
