"""The README's main job (`make demo` -> cooper_openrlhf.cli.demo): its inputs and its train_cooper command."""

import json
from argparse import Namespace
from pathlib import Path

from cooper_openrlhf.cli import demo
from cooper_openrlhf.cli.train_cooper import parse_args


def test_demo_command_is_a_valid_cooper_configuration(tmp_path):
    argv = demo.cooper_argv(Namespace(steps=3, max_new_tokens=160, seed=0), tmp_path, tmp_path / "rm")
    assert argv[1:3] == ["-m", "cooper_openrlhf.cli.train_cooper"]
    args = parse_args(argv[3:])  # OpenRLHF's parser and validation block, plus Cooper's checks
    assert args.remote_rm_trainable and args.cooper.reward_source == "rm"
    assert args.algo.advantage.estimator == "group_norm" and args.rollout.n_samples_per_prompt == 4
    assert args.data.max_samples == 12  # 3 steps of 4 prompts


def test_bootstrap_labels_come_from_the_rule_verifier_and_both_classes_occur(tmp_path):
    counts = demo.write_labelled_triples(tmp_path / "triples.jsonl", 6, seed=1)
    rows = [json.loads(line) for line in (tmp_path / "triples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 * len(demo.COMPLETION_TEMPLATES) * 2
    assert counts == {"correct": sum(r["label"] for r in rows), "incorrect": sum(1 - r["label"] for r in rows)}
    assert counts["correct"] > 0 and counts["incorrect"] > 0
    for row in rows:  # a completion is labelled correct exactly when its boxed/last number is the reference
        assert row["label"] == int(row["completion"].rstrip(".").split()[-1].strip("\\boxed{}") == row["reference"])


def test_prompts_carry_the_reference_as_label(tmp_path):
    demo.write_prompts(tmp_path / "prompts.jsonl", 5, seed=0)
    rows = [json.loads(line) for line in Path(tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all(demo.INSTRUCTION in r["prompt"] and r["answer"].isdigit() for r in rows)


def test_cpu_settings_apply_only_where_torch_sees_no_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the CUDA boundary: a GPU machine
    on_gpu = demo.run_environment()
    assert "DS_ACCELERATOR" not in on_gpu and "OMP_NUM_THREADS" not in on_gpu and on_gpu["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert demo.run_environment()["DS_ACCELERATOR"] == "cpu"


def test_demo_runs_in_the_devices_fast_dtype(tmp_path):
    from cooper_openrlhf.runtime.dtype import resolve_dtype_name

    argv = demo.cooper_argv(Namespace(steps=1, max_new_tokens=16, seed=0), tmp_path, tmp_path / "rm")
    assert "--ds.param_dtype" not in argv
    assert parse_args(argv[3:]).ds.param_dtype == resolve_dtype_name("auto")
