"""verifyrm train: BCE on OpenRLHF's DeepspeedStrategy (2 ranks, ZeRO-2, the CPU's fast dtype), export, and OpenRLHF's loader.

Training runs in a subprocess (torchrun, gloo on CPU) so torch.distributed state never leaks into pytest.
ZeRO-3 is exercised on one rank by tests/test_verifyrm_e2e.py: with several gloo ranks, DeepSpeed 0.19.6's
coalesced ZeRO-3 all-gather waits only for its last handle and can read uninitialised memory
(deepspeedai/DeepSpeed#8539, CPU only; CUDA streams order the gathers).
"""

import json
import os
import random
import re
import subprocess
import sys

import pytest

from cooper_openrlhf.cli.verifyrm import main
from cooper_openrlhf.runtime.dtype import resolve_dtype_name, torch_dtype

EPOCHS = 3


def separable_rows(n_questions: int, seed: int = 0) -> list[dict]:
    """Per question one boxed correct solution (label 1) and one refusal (label 0): learnable in a few steps."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n_questions):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        question = f"What is {a} + {b}?"
        rows.append({"question": question, "reference": str(a + b),
                     "completion": f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}.", "label": 1})
        rows.append({"question": question, "reference": str(a + b), "completion": "I do not know.", "label": 0})
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory, model_dir):
    """Two ranks, ZeRO-2, the default dtype (auto), micro batch 2 x 2 ranks x accumulation 2 = batch 8, 3 epochs, best by eval loss."""
    root = tmp_path_factory.mktemp("two_ranks")
    data = write_jsonl(root / "data.jsonl", separable_rows(16))
    out = root / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "cooper_openrlhf.cli.verifyrm", "train", "--model.model_name_or_path", model_dir("tiny-qwen2-rm"),
         "--data.dataset", data, "--ckpt.output_dir", str(out), "--train.max_epochs", str(EPOCHS), "--adam.lr", "1e-3",
         "--data.max_len", "64", "--eval-fraction", "0.25", "--best-metric", "loss", "--lr_warmup_ratio", "0.3",
         "--ds.zero_stage", "2",
         "--train.batch_size", "8", "--train.micro_batch_size", "2"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    return out, result


@pytest.mark.slow
def test_two_rank_training_learns_logs_and_keeps_the_best_epoch(two_rank_run):
    out, result = two_rank_run
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["zero_stage"] == 2 and summary["param_dtype"] == resolve_dtype_name("auto")
    history = summary["history"]
    assert [h["epoch"] for h in history] == list(range(EPOCHS))
    assert summary["best"] == min(history, key=lambda h: h["loss"])
    assert history[-1]["loss"] < history[0]["loss"] and summary["best"]["accuracy"] == 1.0, history

    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_lines = [line for line in lines if line["kind"] == "train"]
    assert [line["kind"] for line in lines].count("eval") == EPOCHS
    assert [line["step"] for line in train_lines] == list(range(1, summary["optimizer_steps"] + 1))
    lrs = [line["lr"] for line in train_lines]
    assert lrs[0] < max(lrs) and lrs[-1] < max(lrs), f"warm-up then decay: {lrs}"
    assert (out / "tensorboard").is_dir() and (out / "eval_split.jsonl").read_text().count("\n") == summary["eval_rows"]
    assert f"-> {out / 'best'}" in result.stdout


@pytest.mark.slow
def test_export_gives_the_same_scores_through_transformers_and_openrlhf(two_rank_run):
    import torch
    from openrlhf.models import get_llm_for_sequence_regression
    from transformers import AutoModelForSequenceClassification

    from cooper_openrlhf.algo.template import CONFIG_KEY
    from cooper_openrlhf.rm.model import load_rm, render_and_encode, rm_logits
    from cooper_openrlhf.rm.export import require_openrlhf_compatible

    best = str(two_rank_run[0] / "best")
    config = json.loads((two_rank_run[0] / "best" / "config.json").read_text())
    assert config[CONFIG_KEY]["version"] == "verifyrm-v1" and config[CONFIG_KEY]["max_length"] == 64
    require_openrlhf_compatible(best)

    run_dtype = resolve_dtype_name("auto")  # what the training above ran in
    ours, tokenizer, version = load_rm(best, dtype=torch_dtype(run_dtype))
    plain = AutoModelForSequenceClassification.from_pretrained(best, dtype=torch_dtype(run_dtype),
                                                               attn_implementation="eager").eval()
    openrlhf_rm = get_llm_for_sequence_regression(best, "reward", param_dtype=run_dtype, attn_implementation="eager").eval()
    batch = render_and_encode(tokenizer, ["What is 2 + 2?", "What is 17 + 25?"], ["4", "42"],
                              ["2 + 2 = 4. The answer is \\boxed{4}.", "I do not know."], 64, version)
    with torch.no_grad():
        ours_logits = rm_logits(ours.eval(), batch)
        plain_logits = plain(**batch).logits.squeeze(-1).float()
        openrlhf_logits = openrlhf_rm(batch["input_ids"], batch["attention_mask"]).float()
    torch.testing.assert_close(plain_logits, ours_logits)
    torch.testing.assert_close(openrlhf_logits, ours_logits)
    assert ours_logits[0] > 0 > ours_logits[1], "the trained RM separates a correct answer from a refusal"


@pytest.mark.parametrize(
    "rows, message",
    [
        ([], "is empty: nothing to train on"),
        ([r for r in separable_rows(6) if r["label"] == 1], "has one class only: all .* rows have label 1"),
        ([*separable_rows(2), {"question": "q", "reference": "1", "completion": "", "label": 0}],
         r"data\.jsonl:5: field 'completion' is empty"),
    ],
)
def test_training_refuses_bad_datasets_before_starting(tmp_path, capsys, rows, message):
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    code = main(["train", "--pretrain", "unused", "--data", data, "--out", str(tmp_path / "run")])
    assert code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_train_rejects_flags_it_cannot_forward(tmp_path):
    with pytest.raises(SystemExit):
        main(["train", "--pretrain", "p", "--data", "d", "--out", "o", "--learning-rate", "1"])


def _parsed_train_config(monkeypatch, argv):
    """The TrainConfig `verifyrm train` builds from argv (training itself stubbed out: only the CLI is under test)."""
    import cooper_openrlhf.rm.bce_train as bce_train

    seen = {}
    monkeypatch.setattr(bce_train, "train", lambda config, openrlhf_argv: seen.update(config=config) or {})
    monkeypatch.setattr("torch.distributed.get_rank", lambda: 1)
    monkeypatch.setattr("torch.distributed.destroy_process_group", lambda: None)
    assert main(["train", *argv]) == 0
    return seen["config"]


NEW_NAMES = ["--model.model_name_or_path", "m", "--data.dataset", "d.jsonl", "--ckpt.output_dir", "o",
             "--train.max_epochs", "2", "--adam.lr", "3e-5", "--data.max_len", "512", "--lr_warmup_ratio", "0.05"]
OLD_NAMES = ["--pretrain", "m", "--data", "d.jsonl", "--out", "o", "--epochs", "2", "--lr", "3e-5",
             "--max-length", "512", "--warmup-ratio", "0.05"]


def test_train_takes_openrlhf_train_rm_flag_names_and_the_old_ones_for_one_release(monkeypatch, capsys):
    new = _parsed_train_config(monkeypatch, NEW_NAMES)
    assert (new.pretrain, new.data, new.out, new.epochs, new.lr, new.max_length, new.warmup_ratio) == \
        ("m", "d.jsonl", "o", 2, 3e-5, 512, 0.05)
    assert "deprecated" not in capsys.readouterr().err
    old = _parsed_train_config(monkeypatch, OLD_NAMES)
    assert old == new
    notes = [line for line in capsys.readouterr().err.splitlines() if "deprecated" in line]
    assert len(notes) == 7 and notes[0] == ("verifyrm train: --pretrain is deprecated, use --model.model_name_or_path "
                                            "(OpenRLHF train_rm's name); accepted for one release")


def test_train_refuses_two_names_for_one_setting_and_names_a_missing_required_flag(capsys):
    with pytest.raises(SystemExit):
        main(["train", *NEW_NAMES, "--lr", "1e-4"])
    assert "--lr and --adam.lr name the same setting; give only --adam.lr" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--data.dataset", "d.jsonl"])
    assert "verifyrm train needs --model.model_name_or_path, --ckpt.output_dir" in capsys.readouterr().err
