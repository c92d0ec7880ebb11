"""train_cooper's command line: the CPU dtypes of --ds.param_dtype, the group estimators, the reference check at
start-up, the Ray cluster choice, and the fingerprint of the stock `train()` it mirrors."""

import ast
import hashlib
import json

import pytest

from cooper_openrlhf.cli.cooper_args import CooperArgsError
from cooper_openrlhf.runtime.dtype import DtypeError, resolve_dtype_name

BASE = ["--actor.model_name_or_path", "policy", "--data.prompt_dataset", "prompts.jsonl", "--data.label_key", "label",
        "--vllm.num_engines", "1", "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4",
        "--reward.model_name_or_path", "rm"]


def _parse(argv):
    from cooper_openrlhf.cli.train_cooper import parse_args

    return parse_args(argv)


def test_param_dtype_defaults_to_auto_resolved_once_and_announced(monkeypatch, caplog):
    from cooper_openrlhf.runtime.dtype import RUN_DTYPE_ENV, cpu_dtype_reason, run_dtype_name

    monkeypatch.delenv(RUN_DTYPE_ENV, raising=False)
    args = _parse(BASE)
    assert args.ds.param_dtype == resolve_dtype_name("auto")  # every actor sees the concrete name
    # said once, with why: the CPU's units, or COOPER_CPU_BF16 where it is set (tests/test_runtime_dtype.py)
    assert f"--ds.param_dtype auto -> {args.ds.param_dtype} ({cpu_dtype_reason()})" in caplog.text
    assert run_dtype_name() == args.ds.param_dtype  # and so do vLLM engines and Ray workers started later
    assert _parse([*BASE, "--ds.param_dtype", "fp32"]).ds.param_dtype == "fp32"
    assert _parse([*BASE, "--ds.param_dtype", "bf16"]).ds.param_dtype == "bf16"


def test_dtypes_that_misfit_the_device_fail_at_start_naming_the_flag(monkeypatch):
    import torch

    with pytest.raises(DtypeError, match="--ds.param_dtype fp16: fp16 on CPU is emulated"):
        _parse([*BASE, "--ds.param_dtype", "fp16"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the CUDA boundary: a GPU machine
    with pytest.raises(DtypeError, match="--ds.param_dtype fp32: fp32 is a CPU dtype"):
        _parse([*BASE, "--ds.param_dtype", "fp32"])
    assert _parse(BASE).ds.param_dtype == "bf16"  # GPU runs unchanged: OpenRLHF's bf16


def test_a_cpu_head_node_of_a_named_cluster_resolves_auto_for_its_gpus(monkeypatch):
    from cooper_openrlhf.runtime import dtype

    monkeypatch.setattr(dtype, "cpu_has_bf16_units", lambda: False)
    assert _parse(BASE).ds.param_dtype == "fp32"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert _parse(BASE).ds.param_dtype == "bf16"


def test_a_submitted_job_is_judged_for_its_nodes_dtype_and_device_flags_alike(monkeypatch):
    """Inside a job (`ray job submit` sets RAY_ADDRESS and the job's runtime env), the driver's own CUDA says nothing:
    a GPU job driven from a CPU-only head node takes fp16 and refuses gloo weight sync, where the device check
    judged the head node (it refused fp16 and accepted gloo); a CPU-mode job (the launchers' GPUS_PER_NODE=0 puts
    the CPU runtime in the job's env) resolves auto to the CPU's dtype, not the GPUs' bf16, and takes gloo."""
    from cooper_openrlhf.runtime import dtype
    from cooper_openrlhf.runtime.cpu import CPU_RUNTIME_ENV
    from cooper_openrlhf.runtime.ray_env import RAY_JOB_CONFIG_ENV

    monkeypatch.setattr(dtype, "cpu_has_bf16_units", lambda: False)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv(RAY_JOB_CONFIG_ENV, json.dumps({"runtime_env": {"env_vars": {"NCCL_DEBUG": "WARN"}}}))
    assert _parse([*BASE, "--ds.param_dtype", "fp16"]).ds.param_dtype == "fp16"
    with pytest.raises(CooperArgsError, match="--vllm.sync_backend gloo is this package's CPU weight sync"):
        _parse([*BASE, "--vllm.sync_backend", "gloo"])
    monkeypatch.setenv(RAY_JOB_CONFIG_ENV, json.dumps({"runtime_env": {"env_vars": {CPU_RUNTIME_ENV: "1"}}}))
    args = _parse([*BASE, "--vllm.sync_backend", "gloo"])
    assert (args.ds.param_dtype, args.vllm.sync_backend) == ("fp32", "gloo")


def test_verifyrm_train_takes_the_same_dtype_choices():
    from cooper_openrlhf.runtime.openrlhf_args import parse_openrlhf_args

    assert parse_openrlhf_args([]).ds.param_dtype == resolve_dtype_name("auto")
    assert parse_openrlhf_args(["--ds.param_dtype", "fp32"]).ds.param_dtype == "fp32"
    with pytest.raises(SystemExit):  # argparse's choices
        parse_openrlhf_args(["--ds.param_dtype", "fp8"])


@pytest.mark.parametrize("estimator", ["group_norm", "rloo", "reinforce_baseline", "dr_grpo"])
def test_group_baseline_estimators_are_accepted(estimator):
    args = _parse([*BASE, "--algo.advantage.estimator", estimator])
    assert args.algo.advantage.estimator == estimator


@pytest.mark.parametrize("estimator", ["gae", "reinforce", "flash_reinforce"])
def test_estimators_without_a_group_baseline_are_rejected(estimator):
    with pytest.raises(CooperArgsError, match=f"--algo.advantage.estimator {estimator}: Cooper uses a group baseline"):
        _parse([*BASE, "--algo.advantage.estimator", estimator])


def _check(tmp_path, rows, *flags):
    from openrlhf.utils import get_strategy

    from cooper_openrlhf.cli.train_cooper import check_prompt_dataset

    # A new file per call: datasets caches a local JSON file by path and mtime, and two writes within one clock
    # tick of the file system would read back the first one's rows.
    path = tmp_path / f"prompts-{len(list(tmp_path.glob('prompts-*.jsonl')))}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = [*BASE, "--data.input_key", "question", *flags]
    argv[argv.index("--data.prompt_dataset") + 1] = str(path)
    strategy = get_strategy(_parse(argv))
    check_prompt_dataset(strategy.args, strategy)
    return path


def _gsm8k_rows(n_raw: int, n_clean: int) -> list[dict]:
    raw = [{"question": f"Tom has {i} apples and buys {i}. How many?", "label": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}"}
           for i in range(n_raw)]
    return raw + [{"question": f"What is {i} + 1?", "label": str(i + 1)} for i in range(n_clean)]


def test_raw_gsm8k_labels_fail_at_start_naming_file_row_field_and_value(tmp_path):
    with pytest.raises(ValueError) as raised:
        _check(tmp_path, _gsm8k_rows(2, 8))
    message = str(raised.value)
    assert "2 of 10 prompt rows (20.0%)" in message and "--cooper.max_unparseable_reference_share 0.0" in message
    assert "row 0 (0-based), field 'label' (--data.label_key) = '0 + 0 = <<0+0=0>>0\\n#### 0'" in message
    assert "its marked final answer is '0': store that" in message and "row 1 (0-based)" in message


def test_a_share_of_unparseable_references_can_be_accepted(tmp_path):
    _check(tmp_path, _gsm8k_rows(2, 8), "--cooper.max_unparseable_reference_share", "0.2")
    with pytest.raises(ValueError, match="3 of 10 prompt rows"):
        _check(tmp_path, _gsm8k_rows(3, 7), "--cooper.max_unparseable_reference_share", "0.2")
    with pytest.raises(CooperArgsError, match="must be in \\[0, 1\\]"):
        _parse([*BASE, "--cooper.max_unparseable_reference_share", "1.5"])


@pytest.mark.parametrize("reference, usable", [("72", True), ("\\frac{1}{2}", True), ("$1,000", True),
                                               ("\\boxed{3}", True), ("x^2 + 1", True), ("", False),
                                               ("so 5 \\boxed{5}", False), ("4 * 2 = 8\n#### 8", False)])
def test_reference_problem(reference, usable):
    from cooper_openrlhf.cli.train_cooper import reference_problem

    assert (reference_problem(reference) is None) is usable


# Fingerprint of the pinned OpenRLHF's `openrlhf.cli.train_ppo_ray.train` (the AST, so formatting does not count).
STOCK_TRAIN_FINGERPRINT = "c029c8fd6c5d4493"  # openrlhf 0.11.2


def stock_train_fingerprint() -> str:
    import importlib.util
    from pathlib import Path

    source = Path(importlib.util.find_spec("openrlhf.cli.train_ppo_ray").origin).read_text()
    (train,) = [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name == "train"]
    return hashlib.sha256(ast.dump(train, include_attributes=False).encode()).hexdigest()[:16]


def test_stock_train_has_the_shape_train_cooper_mirrors():
    assert stock_train_fingerprint() == STOCK_TRAIN_FINGERPRINT, (
        "openrlhf.cli.train_ppo_ray.train changed (an OpenRLHF upgrade?). cooper_openrlhf/cli/train_cooper.py's "
        "train_cooper() mirrors it step by step (Ray start, placement groups, create_vllm_engines arguments, actor "
        "groups, trainer arguments, init order, saving): re-check each against the new train(), port what changed, "
        "then record the new fingerprint here.")


def test_the_interception_is_undone_after_parsing_and_after_a_failed_check():
    import argparse

    original = argparse.ArgumentParser.parse_args
    _parse(BASE)
    assert argparse.ArgumentParser.parse_args is original
    with pytest.raises(CooperArgsError):
        _parse([*BASE, "--algo.advantage.estimator", "reinforce"])
    assert argparse.ArgumentParser.parse_args is original
    assert argparse.ArgumentParser().parse_args([]) == argparse.Namespace()  # plain parsers parse again
