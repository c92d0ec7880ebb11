"""rm/model.py and rm/export.py on real (tiny and small) checkpoints: load rules, encoding, logits, export round trip, RMScorer."""

import json
import logging
import shutil

import pytest
import torch

from cooper_openrlhf.algo.template import CONFIG_KEY, render_rm_input
from cooper_openrlhf.rm.export import OpenRLHFIncompatibleError, export_rm, require_openrlhf_compatible
from cooper_openrlhf.rm.model import (
    DEFAULT_RM_MAX_LENGTH,
    NotASequenceClassifierError,
    check_reward_model,
    encode_rm_texts,
    load_rm,
    recorded_max_length,
    render_and_encode,
    rm_logits,
    score_logits,
    usable_max_length,
)
from cooper_openrlhf.rm.scorer import RMScorer

QUESTIONS = ["What is 2 + 2?", "Mia has 12 apples and buys 3 bags of 4. How many apples?", "q"]
REFERENCES = ["4", "24", "1"]
COMPLETIONS = ["2 + 2 = 4. The answer is \\boxed{4}.", "12 + 3 * 4 = 24 " * 5 + "\\boxed{24}", ""]


def test_a_one_logit_classifier_loads_with_pad_token_and_template(model_dir):
    model, tokenizer, version = load_rm(model_dir("tiny-qwen2-rm"))
    assert type(model).__name__ == "Qwen2ForSequenceClassification" and model.config.num_labels == 1
    assert tokenizer.pad_token_id is not None and model.config.pad_token_id == tokenizer.pad_token_id
    assert version == "verifyrm-v1"


@pytest.mark.parametrize("name, found", [("tiny-qwen2-policy", "Qwen2ForCausalLM"), ("minilm-l6-v2", "BertModel")])
def test_a_backbone_without_head_needs_init_head(model_dir, name, found):
    with pytest.raises(NotASequenceClassifierError, match=rf"{name} is not a sequence classifier .*{found}.*init_head=True"):
        load_rm(model_dir(name))


def test_init_head_gives_a_fresh_small_one_logit_head(model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="cooper_openrlhf.rm.model"):
        model, _, _ = load_rm(model_dir("minilm-l6-v2"), init_head=True)
    assert type(model).__name__ == "BertForSequenceClassification" and model.config.num_labels == 1
    assert "new one-logit head" in caplog.text and "classifier.weight" in caplog.text
    assert float(model.classifier.bias.detach().abs().max()) == 0.0
    assert float(model.classifier.weight.detach().std()) < 3.0 / (model.config.hidden_size + 1)
    policy_as_rm, _, _ = load_rm(model_dir("tiny-qwen2-policy"), init_head=True)
    assert type(policy_as_rm).__name__ == "Qwen2ForSequenceClassification"


def test_multi_label_classifiers_and_folders_without_config_are_refused(model_dir, tmp_path):
    with open(model_dir("tiny-qwen2-rm") + "/config.json") as handle:
        config = json.load(handle)
    config["id2label"] = {"0": "a", "1": "b", "2": "c"}
    config["label2id"] = {"a": 0, "b": 1, "c": 2}
    (tmp_path / "three").mkdir()
    (tmp_path / "three" / "config.json").write_text(json.dumps(config))
    with pytest.raises(NotASequenceClassifierError, match=r"three is a 3-label classifier"):
        load_rm(str(tmp_path / "three"), init_head=True)
    with pytest.raises(NotASequenceClassifierError, match="folder without config.json"):
        load_rm(str(tmp_path))
    # The config-only check (run before any weights load) applies the same rules.
    assert check_reward_model(model_dir("tiny-qwen2-rm")).num_labels == 1
    with pytest.raises(NotASequenceClassifierError, match=r"three is a 3-label classifier"):
        check_reward_model(str(tmp_path / "three"))
    with pytest.raises(NotASequenceClassifierError, match="not a sequence classifier"):
        check_reward_model(model_dir("tiny-qwen2-policy"))


def test_encoding_pads_right_and_counts_truncation(model_dir, caplog):
    _, tokenizer, _ = load_rm(model_dir("tiny-qwen2-rm"))
    with caplog.at_level(logging.WARNING, logger="cooper_openrlhf.rm.model"):
        batch = encode_rm_texts(tokenizer, ["short", "a much longer text " * 40], max_length=32)
    assert batch["input_ids"].shape == (2, 32) and set(batch) == {"input_ids", "attention_mask"}
    mask = batch["attention_mask"]
    assert mask[0, 0] == 1 and mask[0, -1] == 0  # right padding
    assert "1 of 2 RM inputs exceed 32 tokens" in caplog.text


@pytest.mark.parametrize("name", ["tiny-qwen2-rm", "minilm-l6-v2"])
@pytest.mark.parametrize("max_length", [8, 31, 32, 33, 512])
def test_encoding_equals_the_tokenizers_own_padded_and_truncated_call(model_dir, name, max_length):
    """The encoding tokenizes once (rows at the limit again) and must give exactly what one call of the tokenizer
    with padding and truncation gives, special tokens included (MiniLM ends a cut row with [SEP])."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir(name))
    texts = ["short", "a much longer text " * 40, "中文 テスト ünïcode " * 3, "x" * 31, " ".join(["word"] * 31), ""]
    ours = encode_rm_texts(tokenizer, texts, max_length)
    theirs = tokenizer(texts, padding=True, truncation=True, max_length=max_length, padding_side="right",
                       return_attention_mask=True, return_tensors="pt")
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    assert torch.equal(ours["attention_mask"], theirs["attention_mask"])


@pytest.mark.parametrize("name, kwargs", [("tiny-qwen2-rm", {}), ("minilm-l6-v2", {"init_head": True})])
def test_batched_logits_equal_one_by_one(model_dir, name, kwargs):
    model, tokenizer, version = load_rm(model_dir(name), **kwargs)
    model.eval()
    with torch.no_grad():
        batched = rm_logits(model, render_and_encode(tokenizer, QUESTIONS, REFERENCES, COMPLETIONS, 256, version))
        single = torch.cat([
            rm_logits(model, encode_rm_texts(tokenizer, [render_rm_input(q, r, c)], 256))
            for q, r, c in zip(QUESTIONS, REFERENCES, COMPLETIONS)
        ])
    assert batched.shape == (3,) and batched.dtype == torch.float32
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-4)


def test_score_logits_in_any_micro_batch_size_equal_one_by_one(model_dir):
    model, tokenizer, version = load_rm(model_dir("tiny-qwen2-rm"))
    model.train()
    with torch.no_grad():
        single = [rm_logits(model.eval(), encode_rm_texts(tokenizer, [render_rm_input(q, r, c)], 256)).item()
                  for q, r, c in zip(QUESTIONS, REFERENCES, COMPLETIONS)]
    model.train()
    for batch_size in (1, 2, 3):
        scored = score_logits(model, tokenizer, QUESTIONS, REFERENCES, COMPLETIONS, max_length=256,
                              template_version=version, batch_size=batch_size)
        assert scored == pytest.approx(single, abs=1e-5)
        assert not model.training  # scored in eval mode (no dropout)
    with pytest.raises(ValueError, match="differ in length: 3, 3, 2"):
        score_logits(model, tokenizer, QUESTIONS, REFERENCES, COMPLETIONS[:2], max_length=256,
                     template_version=version, batch_size=2)


def test_an_engine_whose_module_was_put_in_training_mode_directly_still_scores_in_eval_mode(model_dir):
    # score_logits skips eval() when nothing is training (it walks every module); a DeepSpeed engine's own flag
    # is not its module's when the module was switched directly, so both are read
    class Engine(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, **inputs):
            return self.module(**inputs)

    model, tokenizer, version = load_rm(model_dir("tiny-qwen2-rm"))
    engine = Engine(model).eval()
    model.train()
    score_logits(engine, tokenizer, QUESTIONS, REFERENCES, COMPLETIONS, max_length=256, template_version=version,
                 batch_size=3)
    assert not model.training


def test_max_length_without_a_request_or_a_record_is_the_default_capped_at_the_positions(model_dir):
    rm, _, _ = load_rm(model_dir("tiny-qwen2-rm"))  # 2048 positions, no VerifyRM record
    assert usable_max_length(rm) == DEFAULT_RM_MAX_LENGTH == 1024
    assert usable_max_length(rm, 4096) == 2048
    minilm, _, _ = load_rm(model_dir("minilm-l6-v2"), init_head=True)  # 512 positions
    assert usable_max_length(minilm) == 512


def test_export_round_trip_records_template_and_length(model_dir, tmp_path):
    model, tokenizer, version = load_rm(model_dir("tiny-qwen2-rm"))
    with torch.no_grad():
        model.score.weight.mul_(3.0)  # an RM whose scores differ from the original checkpoint's
    out = export_rm(model, tokenizer, tmp_path / "rm", template_version=version, max_length=64)
    (out / "stale-file").write_text("from the first export")
    out = export_rm(model, tokenizer, tmp_path / "rm", template_version=version, max_length=64)
    assert not (out / "stale-file").exists(), "a re-export replaces the folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rm"], "no temporary folders left behind"
    record = json.loads((out / "config.json").read_text())[CONFIG_KEY]
    assert record["version"] == "verifyrm-v1" and record["max_length"] == 64 and record["openrlhf_compatible"] is True

    reloaded, _, reloaded_version = load_rm(str(out))
    assert reloaded_version == version and recorded_max_length(reloaded.config) == 64
    batch = render_and_encode(tokenizer, QUESTIONS, REFERENCES, COMPLETIONS, 64, version)
    with torch.no_grad():
        torch.testing.assert_close(rm_logits(reloaded.eval(), batch), rm_logits(model.eval(), batch))
    scorer = RMScorer.load(str(out))
    assert scorer.max_length == 64
    with torch.no_grad():
        expected = torch.sigmoid(rm_logits(model, batch)).tolist()
    assert scorer.score(QUESTIONS, REFERENCES, COMPLETIONS) == pytest.approx(expected, abs=1e-6)
    require_openrlhf_compatible(str(out))
    with pytest.raises(ValueError, match="trained with template 'verifyrm-v1', not 'verifyrm-v0'"):
        RMScorer.load(str(out), template_version="verifyrm-v0")


def test_an_encoder_export_says_openrlhf_cannot_load_it(model_dir, tmp_path, caplog):
    model, tokenizer, version = load_rm(model_dir("minilm-l6-v2"), init_head=True)
    with caplog.at_level(logging.WARNING, logger="cooper_openrlhf.rm.model"):
        out = export_rm(model, tokenizer, tmp_path / "minilm-rm", max_length=128)
    assert "get_llm_for_sequence_regression" in caplog.text
    assert json.loads((out / "config.json").read_text())[CONFIG_KEY]["openrlhf_compatible"] is False
    with pytest.raises(OpenRLHFIncompatibleError, match="BertForSequenceClassification .* new random head"):
        require_openrlhf_compatible(str(out))
    # Our own loading path scores it, with the recorded length and without a head re-initialisation.
    assert RMScorer.load(str(out)).max_length == 128
    shutil.rmtree(out)


def test_score_cli_adds_rewards_and_refuses_a_policy(model_dir, tmp_path, capsys):
    from cooper_openrlhf.cli.verifyrm import main

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": q, "reference": r, "completion": c, "id": i}) + "\n"
                            for i, (q, r, c) in enumerate(zip(QUESTIONS, REFERENCES, COMPLETIONS))))
    assert main(["score", "--model", model_dir("tiny-qwen2-rm"), "--data", str(data), "--out", str(tmp_path / "o.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    expected = RMScorer.load(model_dir("tiny-qwen2-rm")).score(QUESTIONS, REFERENCES, COMPLETIONS)
    assert [row["id"] for row in rows] == [0, 1, 2]
    assert [row["reward"] for row in rows] == pytest.approx(expected, abs=1e-6)

    code = main(["score", "--model", model_dir("tiny-qwen2-policy"), "--data", str(data), "--out", str(tmp_path / "p.jsonl")])
    assert code == 2 and "is not a sequence classifier" in capsys.readouterr().err
