"""The VerifyRM recipe end to end on CPU with real models: annotate -> train (ZeRO-3) -> score -> compare -> eval_verifier.

Generators: SmolLM2-135M-Instruct and the tiny policy; judge: SmolLM2; RM: MiniLM with a new head. Small on
purpose (16 synthetic questions, 2 completions each, 32 new tokens); docs/verifyrm.md has the full-size run.
16 and not fewer: only the triples where math-verify and the judge agree are kept, and with 8 questions the
kept rows of a run sampled in fp32 (CPUs without bf16 units) left the training split with one class.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from cooper_openrlhf.algo.template import CONFIG_KEY
from cooper_openrlhf.cli.verifyrm import main
from cooper_openrlhf.rm.annotate import output_paths

ENV = {**os.environ, "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu"}


@pytest.mark.slow
def test_annotate_train_score_compare_and_benchmark_an_exported_verifyrm(tmp_path, model_dir, capsys):
    smol, tiny, minilm = model_dir("smollm2-135m-instruct"), model_dir("tiny-qwen2-policy"), model_dir("minilm-l6-v2")
    data = tmp_path / "annotated.jsonl"
    assert main(["annotate", "--synthetic", "16", "--generator", smol, "--generator", tiny, "--judge", smol, "-k", "2",
                 "--max-new-tokens", "32", "--judge-max-new-tokens", "16", "--chunk-size", "8", "--out", str(data)]) == 0
    paths = output_paths(data)
    summary = json.loads(paths["summary"].read_text())
    assert summary["total"]["generated"] == 16 * 2 * 2 and set(summary["per_generator"]) == {smol, tiny}
    assert "agreement" in capsys.readouterr().out
    kept = [json.loads(line) for line in paths["kept"].read_text().splitlines()]
    assert all(row["label"] == int(row["rule_verdict"] == "correct") == int(row["judge_verdict"] == "yes") for row in kept)

    run = tmp_path / "run"
    trained = subprocess.run(
        [sys.executable, "-m", "cooper_openrlhf.cli.verifyrm", "train", "--model.model_name_or_path", minilm,
         "--init-head", "--data.dataset", str(data), "--ckpt.output_dir", str(run), "--train.max_epochs", "3",
         "--adam.lr", "1e-4", "--data.max_len", "256",
         "--eval-fraction", "0.3", "--ds.zero_stage", "3", "--train.batch_size", "4", "--train.micro_batch_size", "2"],
        capture_output=True, text=True, timeout=600, env=ENV,
    )
    assert trained.returncode == 0, trained.stderr[-5000:]
    train_summary = json.loads((run / "train_summary.json").read_text())
    assert train_summary["zero_stage"] == 3 and len(train_summary["history"]) == 3
    record = json.loads((run / "best" / "config.json").read_text())[CONFIG_KEY]
    assert record["max_length"] == 256 and record["openrlhf_compatible"] is False  # an encoder: see docs

    scored = tmp_path / "scored.jsonl"
    assert main(["score", "--model", str(run / "best"), "--data", str(paths["kept"]), "--out", str(scored)]) == 0
    rows = [json.loads(line) for line in scored.read_text().splitlines()]
    assert len(rows) == len(kept) and all(row["reward"] == pytest.approx(1 / (1 + math.exp(-row["logit"]))) for row in rows)
    assert [row["completion"] for row in rows] == [row["completion"] for row in kept]

    report, verifybench = tmp_path / "compare.json", tmp_path / "verifybench.jsonl"
    assert main(["compare", "--data", str(paths["kept"]), "--data", str(paths["rejected"]), "--model", str(run / "best"),
                 "--gold", "exact", "--json-out", str(report), "--verifybench-out", str(verifybench)]) == 0
    table = capsys.readouterr().out
    assert all(name in table for name in ("math-verify", "judge", "verifyrm"))
    comparison = json.loads(report.read_text())
    n_rows = summary["total"]["generated"] - summary["total"]["empty"]
    assert comparison["n"] == n_rows and set(comparison["overall"]) == {"math-verify", "judge", "verifyrm"}

    # The exported checkpoint through the verification core's benchmark CLI, on the same rows and gold.
    bench_json = tmp_path / "bench.json"
    bench = subprocess.run(
        [sys.executable, "-m", "cooper_openrlhf.cli.eval_verifier", "--verifier", "rm", "--model", str(run / "best"),
         "--data", str(verifybench), "--json-out", str(bench_json)],
        capture_output=True, text=True, timeout=300, env=ENV,
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert json.loads(bench_json.read_text())["overall"] == comparison["overall"]["verifyrm"]
