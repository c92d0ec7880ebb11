"""`cli.evaluate` end to end with the tiny Qwen2 policy: results, resume after a real kill, bad input; vLLM (slow).

Generation is real (transformers on CPU, a few tokens per sample); grading is the real verifier
pool. The tiny model's answers are mostly wrong or missing: the tests check bookkeeping (counts,
files, caching, errors), not accuracy.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cooper_openrlhf.cli.evaluate import build_parser, main
from cooper_openrlhf.eval.cache import CacheMismatchError, GenerationCache, read_generations
from cooper_openrlhf.eval.runner import grade, score_verdicts
from cooper_openrlhf.verify.pool import VerifierPool
from cooper_openrlhf.verify.rule import Verdict

REPO = Path(__file__).resolve().parent.parent
QUESTIONS = [("What is 2 + 3?", "5"), ("What is 10 - 4?", "6"), ("What is 3 * 3?", "9"), ("What is 8 / 2?", "4"),
             ("What is 7 + 1?", "8"), ("What is 1 + 1?", "2")]


@pytest.fixture
def qa_file(tmp_path):
    path = tmp_path / "arith.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS), encoding="utf-8")
    return path


def hf_args(model_dir, qa_file, out, *extra):
    return ["--model", str(model_dir("tiny-qwen2-policy")), "--engine", "hf", "--benchmarks", f"arith={qa_file}",
            "--samples", "2", "--max-new-tokens", "6", "--batch-questions", "2", "--verifier-workers", "1",
            "--out", str(out), *extra]


def test_parser_names_stay_for_the_slurm_dry_run():
    args = build_parser().parse_args(["--model", "m", "--out", "o"])
    assert args.protocol == "paper" and args.engine == "vllm" and args.dtype == "auto"
    assert args.benchmarks == "gsm8k,svamp,math500,olympiadbench"


def test_hf_run_writes_table_json_markdown_and_cache(model_dir, qa_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(hf_args(model_dir, qa_file, out, "--limit", "4")) == 0
    printed = capsys.readouterr().out
    assert "arith" in printed and "average" in printed and "avg@k" in printed
    results = json.loads((out / "results.json").read_text())
    arith = results["benchmarks"]["arith"]
    assert arith["questions"] == 4 and arith["k"] == 2 and arith["generated_questions"] == 4
    assert sum(arith["verdicts"].values()) == 8  # every sample graded
    assert 0.0 <= arith["avg_at_k"] <= arith["pass_at_k"] <= 1.0
    assert arith["no_answer_share"] == pytest.approx(arith["verdicts"].get("no_answer", 0) / 8)
    assert results["average"]["avg_at_k"] == pytest.approx(arith["avg_at_k"])
    assert results["config"]["dtype"] in ("bf16", "fp32") and results["config"]["temperature"] == 0.7
    assert "| arith | 4 | 2 |" in (out / "results.md").read_text()
    settings, rows = read_generations(out / "generations" / "arith.jsonl")
    assert settings["k"] == 2 and [row["index"] for row in rows] == [0, 1, 2, 3]
    assert all(len(row["completions"]) == 2 for row in rows)


def test_killed_run_resumes_without_regenerating(model_dir, qa_file, tmp_path):
    out = tmp_path / "out"
    cache_path = out / "generations" / "arith.jsonl"
    command = [sys.executable, "-m", "cooper_openrlhf.cli.evaluate",
               *hf_args(model_dir, qa_file, out, "--batch-questions", "1", "--max-new-tokens", "24")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            if cache_path.exists() and len(read_generations(cache_path)[1]) >= 2:
                break
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    _, cached = read_generations(cache_path)
    assert 2 <= len(cached) < len(QUESTIONS), "the kill should land mid-run"
    # A kill during a write leaves a cut-off line: simulate the worst case on top of the real kill.
    with open(cache_path, "a", encoding="utf-8") as handle:
        handle.write('{"index": 5, "question": "What is 1 + 1?", "compl')
    assert main(hf_args(model_dir, qa_file, out, "--batch-questions", "1", "--max-new-tokens", "24")) == 0
    arith = json.loads((out / "results.json").read_text())["benchmarks"]["arith"]
    assert arith["questions"] == len(QUESTIONS) and arith["generated_questions"] == len(QUESTIONS) - len(cached)
    _, rows = read_generations(cache_path)
    assert sorted(row["index"] for row in rows) == list(range(len(QUESTIONS)))
    assert rows[: len(cached)] == cached  # the cached completions were kept, not regenerated
    # A third run generates nothing at all.
    assert main(hf_args(model_dir, qa_file, out, "--batch-questions", "1", "--max-new-tokens", "24")) == 0
    assert json.loads((out / "results.json").read_text())["benchmarks"]["arith"]["generated_questions"] == 0


def test_cache_made_with_other_settings_is_refused(tmp_path):
    path = tmp_path / "g.jsonl"
    with GenerationCache(path, {"model": "a", "k": 8}) as cache:
        cache.append([{"index": 0, "question": "q", "reference": "1", "completions": ["x"] * 8}])
    with pytest.raises(CacheMismatchError, match=r"k: 8 -> 4"):
        GenerationCache(path, {"model": "a", "k": 4})
    with GenerationCache(path, {"model": "a", "k": 8}) as cache:
        assert cache.completions == {0: ["x"] * 8}


def test_empty_generations_count_as_no_answer():
    with VerifierPool(num_workers=1) as pool:
        verdicts, extracted = grade(pool, ["3", "4"], [["", "\\boxed{3}"], ["   ", "so \\boxed{5}"]])
    assert verdicts == [[Verdict.NO_ANSWER, Verdict.CORRECT], [Verdict.NO_ANSWER, Verdict.INCORRECT]]
    assert extracted[0] == [None, "3"]
    score = score_verdicts(verdicts)
    assert score.no_answer_share == pytest.approx(0.5) and score.avg_at_k == pytest.approx(0.25)
    assert score.pass_at_k == pytest.approx(0.5)


@pytest.mark.parametrize(
    "change, message",
    [
        (["--model", "/nonexistent/model"], "--model /nonexistent/model: folder does not exist"),
        (["--benchmarks", "gsm8k,aime", "--data-dir", "."], "unknown benchmark 'aime'; valid: ['gsm8k'"),
        (["--dtype", "fp16"], "fp16"),
    ],
)
def test_bad_input_fails_before_generating(model_dir, qa_file, tmp_path, change, message):
    with pytest.raises(SystemExit, match=message.replace("[", "\\[").replace("(", "\\(")):
        main(hf_args(model_dir, qa_file, tmp_path / "out") + change)
    assert not (tmp_path / "out" / "results.json").exists()


def test_file_without_answer_field_names_file_line_and_field(model_dir, tmp_path):
    path = tmp_path / "noref.jsonl"
    path.write_text(json.dumps({"question": "a", "answer": "1"}) + "\n" + json.dumps({"question": "b"}) + "\n")
    with pytest.raises(SystemExit, match=r"noref\.jsonl:2: field 'answer' is missing"):
        main(hf_args(model_dir, path, tmp_path / "out")[:5] + [f"x={path}", "--out", str(tmp_path / "out")])


@pytest.mark.slow
def test_vllm_run_on_the_tiny_policy(model_dir, qa_file, tmp_path):
    out = tmp_path / "out"
    assert main(["--model", str(model_dir("tiny-qwen2-policy")), "--engine", "vllm", "--benchmarks", f"arith={qa_file}",
                 "--samples", "2", "--max-new-tokens", "8", "--max-model-len", "512", "--verifier-workers", "1",
                 "--engine-arg", "enforce_eager=true", "--out", str(out)]) == 0
    arith = json.loads((out / "results.json").read_text())["benchmarks"]["arith"]
    assert arith["questions"] == len(QUESTIONS) and sum(arith["verdicts"].values()) == 2 * len(QUESTIONS)
    _, rows = read_generations(out / "generations" / "arith.jsonl")
    assert len(rows) == len(QUESTIONS) and all(len(row["completions"]) == 2 for row in rows)
