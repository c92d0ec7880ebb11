"""verifyrm annotate with real models: resume after SIGKILL, empty completions, models that do not load, bad prompts."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cooper_openrlhf.cli.verifyrm import main
from cooper_openrlhf.rm.annotate import AnnotateConfig, AnnotateError, annotate, output_paths
from cooper_openrlhf.rm.data import load_prompts, synthetic_prompts

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def annotate_command(out: Path, generators: list[str], judge: str) -> list[str]:
    command = [sys.executable, "-m", "cooper_openrlhf.cli.verifyrm", "annotate", "--synthetic", "24", "--chunk-size", "2",
               "-k", "2", "--max-new-tokens", "24", "--judge-max-new-tokens", "8", "--judge", judge, "--out", str(out)]
    for generator in generators:
        command += ["--generator", generator]
    return command


def outputs(out: Path) -> dict[str, bytes]:
    return {name: path.read_bytes() for name, path in output_paths(out).items()}


@pytest.mark.slow
def test_a_run_killed_after_its_first_chunk_resumes_to_the_same_output(tmp_path, model_dir):
    tiny = model_dir("tiny-qwen2-policy")
    second = shutil.copytree(tiny, tmp_path / "tiny-copy")  # a second generator (the first one doubles as judge)
    generators = [tiny, str(second)]
    total_chunks = 2 * 12

    whole = annotate_command(tmp_path / "whole" / "data.jsonl", generators, tiny)
    subprocess.run(whole, check=True, env=ENV, capture_output=True, timeout=600)

    cut = tmp_path / "cut" / "data.jsonl"
    process = subprocess.Popen(annotate_command(cut, generators, tiny), env=ENV,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    progress = output_paths(cut)["progress"]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if progress.exists() and progress.read_text().count('"kind": "chunk"') >= 1:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    assert process.wait(timeout=60) == -signal.SIGKILL, "the run finished before it could be killed"
    chunks_before_restart = progress.read_text().count('"kind": "chunk"')
    assert 1 <= chunks_before_restart < total_chunks

    restarted = subprocess.run(annotate_command(cut, generators, tiny), env=ENV, capture_output=True, text=True, timeout=600)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert f"resuming: {chunks_before_restart} chunks already done" in restarted.stderr
    assert outputs(cut) == outputs(tmp_path / "whole" / "data.jsonl")
    summary = json.loads(output_paths(cut)["summary"].read_text())
    assert summary["total"]["generated"] == 24 * 2 * 2
    assert set(summary["per_generator"]) == set(generators)


def test_empty_completions_are_counted_and_dropped(tmp_path, model_dir, caplog):
    """A generator whose final norm is zeroed gives all-zero logits, so greedy decoding repeats token 0
    (<|endoftext|>, a special token): every completion decodes to the empty string."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny = model_dir("tiny-qwen2-policy")
    model = AutoModelForCausalLM.from_pretrained(tiny)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    model.save_pretrained(tmp_path / "mute")
    AutoTokenizer.from_pretrained(tiny).save_pretrained(tmp_path / "mute")

    config = AnnotateConfig(generators=(str(tmp_path / "mute"),), judge=tiny, samples_per_question=1,
                            max_new_tokens=4, temperature=0.0, judge_max_new_tokens=4, chunk_size=4)
    summary = annotate(synthetic_prompts(4), config, tmp_path / "data.jsonl")
    assert summary["total"]["generated"] == 4 and summary["total"]["empty"] == 4 and summary["total"]["kept"] == 0
    assert "4 of 4 completions were empty and were dropped" in caplog.text
    assert output_paths(tmp_path / "data.jsonl")["kept"].read_text() == ""
    assert output_paths(tmp_path / "data.jsonl")["rejected"].read_text() == ""


def test_a_generator_path_that_does_not_exist_fails_before_any_output(tmp_path, model_dir, capsys):
    code = main(["annotate", "--synthetic", "2", "--generator", str(tmp_path / "no-such-model"),
                 "--judge", model_dir("tiny-qwen2-policy"), "--out", str(tmp_path / "data.jsonl")])
    assert code == 2
    assert f"model '{tmp_path / 'no-such-model'}' does not load" in capsys.readouterr().err
    assert not any(path.exists() for path in output_paths(tmp_path / "data.jsonl").values())


def test_a_generator_without_weights_names_itself_when_its_engine_fails(tmp_path, model_dir):
    tiny = model_dir("tiny-qwen2-policy")
    broken = tmp_path / "config-only"
    broken.mkdir()
    shutil.copy(Path(tiny) / "config.json", broken / "config.json")
    config = AnnotateConfig(generators=(str(broken),), judge=tiny, samples_per_question=1, max_new_tokens=4)
    with pytest.raises(AnnotateError, match=rf"generator model '{broken}' does not load \(hf engine\)"):
        annotate(synthetic_prompts(2), config, tmp_path / "data.jsonl")


def test_prompts_without_a_reference_give_file_line_and_field(tmp_path, model_dir, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"question": "What is 1 + 1?", "reference": "2"}) + "\n"
                       + json.dumps({"question": "What is 2 + 2?"}) + "\n")
    tiny = model_dir("tiny-qwen2-policy")
    code = main(["annotate", "--prompts", str(prompts), "--generator", tiny, "--judge", tiny, "--out", str(tmp_path / "o.jsonl")])
    assert code == 2
    assert f"error: {prompts}:2: field 'reference' is missing" in capsys.readouterr().err


@pytest.mark.slow
def test_a_gsm8k_slice_with_smollm2_and_the_tiny_policy(tmp_path, model_dir, shared_data):
    smol, tiny = model_dir("smollm2-135m-instruct"), model_dir("tiny-qwen2-policy")
    problems = load_prompts(shared_data / "gsm8k" / "test.jsonl", "gsm8k", limit=2)
    config = AnnotateConfig(generators=(smol, tiny), judge=smol, samples_per_question=1, max_new_tokens=32,
                            judge_max_new_tokens=16, chunk_size=2)
    summary = annotate(problems, config, tmp_path / "gsm8k.jsonl")
    assert summary["total"]["generated"] == 2 * 2
    paths = output_paths(tmp_path / "gsm8k.jsonl")
    rows = [json.loads(line) for name in ("kept", "rejected") for line in paths[name].read_text().splitlines()]
    assert len(rows) == 4 - summary["total"]["empty"]
    references = {p.question: p.reference for p in problems}
    for row in rows:
        assert row["reference"] == references[row["question"]] and row["source"] == "gsm8k"
        assert row["generator"] in (smol, tiny) and row["rule_verdict"] and row["judge_verdict"]
        assert ("label" in row) != ("reason" in row)


class _OneGpu:
    """vLLM's start-up check at the GPU boundary: an engine claims `gpu_memory_utilization` of the GPU and vLLM
    refuses to start it when less than that is free; a collected engine gives its share back."""

    def __init__(self):
        self.claimed, self.peak, self.started = 0.0, 0.0, []

    def make_engine(self, kind, path, gpu_memory_utilization=0.9, **options):
        import weakref

        assert kind == "vllm"
        free = 1.0 - self.claimed
        if gpu_memory_utilization > free + 1e-9:
            raise ValueError(f"Free memory on device ({free:.2f}) is less than desired GPU memory utilization "
                             f"({gpu_memory_utilization:.2f})")
        self.claimed += gpu_memory_utilization
        self.peak = max(self.peak, self.claimed)
        self.started.append((path, gpu_memory_utilization))
        engine = _ScriptedEngine(path)
        weakref.finalize(engine, self._release, gpu_memory_utilization)
        return engine

    def _release(self, share):
        self.claimed -= share


class _ScriptedEngine:
    def __init__(self, path):
        self.path = path

    def generate(self, prompts, sampling):
        return ["The answer is 4. Yes"] * (len(prompts) * sampling.n)


@pytest.mark.parametrize("budget", [None, 0.8])
def test_gpu_annotation_judge_and_generator_fit_on_one_gpu_together(tmp_path, monkeypatch, model_dir, budget):
    """GPU annotation kept the judge's vLLM engine while a generator's started, both at vLLM's default 0.9: vLLM
    refused the second. Their shares now add up to the configured budget (default vLLM's 0.9)."""
    import cooper_openrlhf.engines as engines

    gpu = _OneGpu()
    monkeypatch.setattr(engines, "make_engine", gpu.make_engine)
    judge, generators = model_dir("tiny-qwen2-policy"), (model_dir("tiny-qwen2-policy"), model_dir("smollm2-135m-instruct"))
    options = {} if budget is None else {"gpu_memory_utilization": budget}
    config = AnnotateConfig(generators=generators, judge=judge, engine="vllm", samples_per_question=1,
                            chunk_size=2, engine_options=options)
    summary = annotate(synthetic_prompts(2), config, tmp_path / "data.jsonl")
    assert summary["total"]["generated"] == 4
    assert [path for path, _ in gpu.started] == [judge, generators[1]]  # the judge doubles as the first generator
    assert gpu.peak == pytest.approx(budget or 0.9)
