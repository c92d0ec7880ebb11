"""A cluster user's first hour: secrets never shown, mistakes caught before the allocation and said in one
`error:` line naming what to change, no noise at start-up."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cooper_openrlhf.cli.launch_plans import plan_rl
from cooper_openrlhf.cluster.checks import Env, PreflightError

REPO = Path(__file__).resolve().parent.parent
CLASSIFIER = {"architectures": ["Qwen2ForSequenceClassification"], "model_type": "qwen2", "num_labels": 1}
CAUSAL_LM = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}


def _model(path: Path, config: dict | None = None) -> str:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config or {}))
    return str(path)


def _prompts(path: Path, rows: int = 64) -> str:
    path.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": str(i + 1), "instruction": "boxed"}) + "\n"
                            for i in range(rows)))
    return str(path)


@pytest.fixture
def rl_env(tmp_path):
    return {"POLICY": _model(tmp_path / "policy"), "VERIFY_RM": _model(tmp_path / "rm", CLASSIFIER),
            "ASSISTANT_MODEL": "policy", "PROMPTS": _prompts(tmp_path / "prompts.jsonl"), "OUT": str(tmp_path / "out"),
            "ROLLOUT_BATCH_SIZE": "8", "TRAIN_BATCH_SIZE": "32"}


# ------------------------------------------------------------------------------------------- secrets
def test_secrets_are_redacted_in_flags_urls_and_variables_and_nothing_else_changes():
    from cooper_openrlhf.runtime.secrets import redact_argv, redact_env, shell_line

    argv = ["python", "-m", "cooper_openrlhf.cli.train_cooper", "--logger.wandb.key", "abc123abc123",
            "--logger.wandb.key=def456def456", "--reward.remote_url", "http://rm:5000/get_reward?token=t0k3n&x=1",
            "--eval.dataset", "https://user:hunter22@example.org/data.jsonl", "--data.input_key", "question",
            "--logger.wandb.key", "env:WANDB_API_KEY", "--note", "my key is hf_abcdefgh123"]
    redacted = redact_argv(argv, {"HF_TOKEN": "hf_abcdefgh123", "HOME": "/root"})
    assert redacted == ["python", "-m", "cooper_openrlhf.cli.train_cooper", "--logger.wandb.key", "***",
                        "--logger.wandb.key=***", "--reward.remote_url", "http://rm:5000/get_reward?token=***&x=1",
                        "--eval.dataset", "https://user:***@example.org/data.jsonl", "--data.input_key", "question",
                        "--logger.wandb.key", "env:WANDB_API_KEY", "--note", "my key is ***"]
    assert redact_env({"WANDB_API_KEY": "k" * 40, "HF_TOKEN": "h" * 20, "MY_SERVICE_TOKEN": "s" * 20, "NODES": "2",
                       "RM_URL": "http://h/x?token=abc"}) == {
        "WANDB_API_KEY": "***", "HF_TOKEN": "***", "MY_SERVICE_TOKEN": "***", "NODES": "2", "RM_URL": "http://h/x?token=***"}
    assert shell_line(["ray", "job", "submit", "--", "python", "--logger.wandb.key", "k" * 40, "a b"]) == \
        "ray job submit -- python --logger.wandb.key '***' 'a b'"


def test_train_cooper_prints_its_args_with_the_wandb_key_and_the_reward_token_redacted():
    """What `strategy.print(args)` shows in the job log: OpenRLHF's nested namespaces, secrets as ***."""
    from cooper_openrlhf.runtime.openrlhf_args import parse_openrlhf_args
    from cooper_openrlhf.runtime.secrets import redact_namespace

    args = parse_openrlhf_args(["--logger.wandb.key", "w" * 40, "--reward.remote_url",
                                "http://rm:5000/get_reward?token=" + "t" * 32])
    shown = repr(redact_namespace(args))
    assert "w" * 40 not in shown and "t" * 32 not in shown
    assert "key='***'" in shown and "get_reward?token=***" in shown
    assert args.logger.wandb.key == "w" * 40  # the run itself still has it


def test_the_reward_clients_errors_name_the_service_without_its_token():
    import socket

    from cooper_openrlhf.clients.http import RewardClient, RewardServiceError

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = "svctoken" + "3" * 24
    with pytest.raises(RewardServiceError) as raised:
        RewardClient(f"http://127.0.0.1:{port}/get_reward?token={token}", retries=0, timeout_s=2).score(["a"], ["a"], ["1"])
    assert token not in str(raised.value) and f"127.0.0.1:{port}/get_reward?token=***" in str(raised.value)


def test_a_wandb_key_named_by_its_variable_must_be_set_where_the_run_starts(monkeypatch):
    from cooper_openrlhf.cli.cooper_args import CooperArgsError
    from cooper_openrlhf.cli.train_cooper import parse_args

    argv = ["--actor.model_name_or_path", "p", "--data.prompt_dataset", "d.jsonl", "--data.label_key", "answer",
            "--vllm.num_engines", "1", "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt",
            "4", "--cooper.reward_source", "rule", "--logger.wandb.key", "env:WANDB_API_KEY"]
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(CooperArgsError, match="--logger.wandb.key env:WANDB_API_KEY: WANDB_API_KEY is not set"):
        parse_args(argv)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert parse_args(argv).logger.wandb.key == "env:WANDB_API_KEY"  # wandb reads the variable itself


# --------------------------------------------------------------------- mistakes caught before the allocation
def test_preflight_refuses_a_verify_rm_that_is_a_causal_lm(rl_env, tmp_path):
    env = {**rl_env, "VERIFY_RM": _model(tmp_path / "causal", CAUSAL_LM)}
    with pytest.raises(PreflightError, match=r"VERIFY_RM=.*causal: not a VerifyRM export: .* is not a sequence "
                                             r"classifier \(architectures \['Qwen2ForCausalLM'\]"):
        plan_rl(Env(env))
    two_labels = {**CLASSIFIER, "num_labels": 2}
    with pytest.raises(PreflightError, match="2-label classifier"):
        plan_rl(Env({**rl_env, "VERIFY_RM": _model(tmp_path / "two", two_labels)}))
    plan_rl(Env(rl_env))  # a one-logit classifier passes


@pytest.mark.parametrize("path", ["/nonexistent/verifyrm", "./runs/verifyrm-best"])
def test_a_nonexistent_reward_model_path_is_said_not_to_exist(path):
    from cooper_openrlhf.rm.model import NotASequenceClassifierError, check_reward_model

    with pytest.raises(NotASequenceClassifierError) as raised:
        check_reward_model(path)
    assert str(raised.value) == f"{path}: folder does not exist"


def test_too_few_rollout_micro_batches_for_the_actor_name_rollout_micro_batch_size(rl_env):
    env = {**rl_env, "ROLLOUT_BATCH_SIZE": "4", "N_SAMPLES": "4", "TRAIN_BATCH_SIZE": "16", "MICRO_BATCH_SIZE": "1"}
    with pytest.raises(PreflightError) as raised:
        plan_rl(Env(env))  # 8 GPUs: actor 4; 16 samples / 16 per micro-batch = 1 micro-batch for 4 actor ranks
    message = str(raised.value)
    assert message.startswith("ROLLOUT_MICRO_BATCH_SIZE=16: ") and "set ROLLOUT_MICRO_BATCH_SIZE <= 4" in message
    assert "the number of sample batches must be >= the effective number of actor processes" in message
    plan_rl(Env({**env, "ROLLOUT_MICRO_BATCH_SIZE": "4"}))


def test_train_cooper_explains_openrlhfs_sample_batch_assertion_with_the_flag_to_change():
    from cooper_openrlhf.cli.cooper_args import CooperArgsError
    from cooper_openrlhf.cli.train_cooper import parse_args

    argv = ["--actor.model_name_or_path", "p", "--data.prompt_dataset", "d.jsonl", "--data.label_key", "answer",
            "--vllm.num_engines", "1", "--algo.advantage.estimator", "group_norm", "--cooper.reward_source", "rule",
            "--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "2", "--rollout.micro_batch_size", "4",
            "--actor.num_gpus_per_node", "2", "--train.batch_size", "4", "--train.micro_batch_size", "1"]
    with pytest.raises(CooperArgsError, match=r"--rollout.micro_batch_size 4: .* 1 micro-batch\(es\), fewer than the "
                                              r"2 actor processes .* use --rollout.micro_batch_size <= 2 \(launchers: "
                                              r"ROLLOUT_MICRO_BATCH_SIZE\)"):
        parse_args(argv)


@pytest.mark.parametrize("layout, actor", [({"NODES": "2", "GPUS_PER_NODE": "3"}, 3), ({"GPUS_PER_NODE": "6"}, 3)])
def test_an_actor_gpu_count_that_misfits_the_batch_is_blamed_on_the_placement(rl_env, layout, actor):
    env = {k: v for k, v in {**rl_env, **layout, "ROLLOUT_BATCH_SIZE": None, "TRAIN_BATCH_SIZE": None}.items() if v}
    with pytest.raises(PreflightError) as raised:
        plan_rl(Env(env))
    message = str(raised.value)
    assert message.startswith(f"NODES={layout.get('NODES', '1')} x GPUS_PER_NODE={layout['GPUS_PER_NODE']} gives the "
                              f"actor {actor} GPU(s)")
    assert "set ACTOR_GPUS=2 or a TRAIN_BATCH_SIZE that is a multiple of MICRO_BATCH_SIZE=4 x 3 = 12" in message
    plan_rl(Env({**env, "ACTOR_GPUS": "2"}))  # the fix it names works


# ---------------------------------------------------------------------------- one error style in train_cooper
def _train_cooper(tmp_path: Path, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "cooper_openrlhf.cli.train_cooper", "--data.label_key", "answer",
            "--data.input_key", "question", "--vllm.num_engines", "1", "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "2", "--rollout.micro_batch_size", "2",
            "--train.batch_size", "4", "--train.micro_batch_size", "1", "--actor.num_gpus_per_node", "1",
            "--reward.num_gpus_per_node", "1", "--cooper.reward_source", "rule", *flags]
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
                                 "RAY_ADDRESS": "127.0.0.1:1", **(env or {})})  # a Ray it must never reach
    result.seconds = time.monotonic() - started
    return result


def _error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_train_cooper_refuses_a_missing_actor_folder_before_ray_in_one_error_line(tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl", rows=8)
    result = _train_cooper(tmp_path, "--actor.model_name_or_path", str(tmp_path / "no-policy"),
                           "--data.prompt_dataset", prompts)
    assert result.returncode == 2, result.stderr[-2000:]
    assert _error_lines(result) == [f"error: --actor.model_name_or_path {tmp_path / 'no-policy'}: model folder does "
                                    "not exist"]
    assert "Traceback" not in result.stderr and "ray" not in result.stderr.lower().replace("array", "")


@pytest.mark.parametrize("mistake, message", [
    ("rm", "error: --reward.model_name_or_path {tmp}/rm-missing: model folder does not exist"),
    ("rm_causal", "error: {tmp}/causal is not a sequence classifier"),
    ("prompts", "error: --data.prompt_dataset {tmp}/missing.jsonl: data file does not exist"),
    ("row", "error: prompt dataset {tmp}/bad.jsonl, row 1 (0-based): field 'question' holds NoneType"),
    ("flag", "error: invalid Cooper configuration:"),
])
def test_train_cooper_reports_each_user_mistake_in_one_error_line_without_a_traceback(tmp_path, mistake, message):
    policy = _model(tmp_path / "policy")
    prompts = _prompts(tmp_path / "p.jsonl", rows=8)
    flags = {"rm": ["--reward.model_name_or_path", str(tmp_path / "rm-missing"), "--cooper.reward_source", "rm"],
             "rm_causal": ["--reward.model_name_or_path", _model(tmp_path / "causal", CAUSAL_LM),
                           "--cooper.reward_source", "rm"],
             "prompts": [],
             "row": [],
             "flag": ["--cooper.rm_lr", "0"]}[mistake]
    if mistake == "prompts":
        prompts = str(tmp_path / "missing.jsonl")
    if mistake == "row":
        prompts = str(tmp_path / "bad.jsonl")
        Path(prompts).write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n" + json.dumps({"answer": "3"}) + "\n")
    result = _train_cooper(tmp_path, "--actor.model_name_or_path", policy, "--data.prompt_dataset", prompts, *flags)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = _error_lines(result)
    assert len(errors) == 1 and errors[0].startswith(message.format(tmp=tmp_path)), result.stderr[-2000:]
    assert "Traceback" not in result.stderr


# ------------------------------------------------------------------------------------------------- noise
def test_start_up_prints_no_pynvml_or_bitsandbytes_noise():
    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.train_cooper", "--help"], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": ""})
    assert result.returncode == 0 and "--remote_rm_trainable" in result.stdout
    assert "pynvml package is deprecated" not in result.stderr
    assert "No module named 'kernels'" not in result.stderr
    shown = subprocess.run([sys.executable, "-c", "import warnings, cooper_openrlhf; warnings.warn('mine', FutureWarning)"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "FutureWarning: mine" in shown.stderr  # every other warning still shows


# ------------------------------------------------------------------------------------------------ libraries
def test_seed_intervals_and_sign_flips_are_scipys_bootstrap_and_permutation_test():
    """The report's interval is scipy.stats.bootstrap's percentile interval for the same seed, and its p-value
    scipy.stats.permutation_test's sign-flip test: exact over all 2^n sign patterns up to 16 seeds (the same p-value
    whatever the seed), Monte Carlo beyond."""
    import numpy as np
    from scipy import stats

    from cooper_openrlhf.report.seed_stats import bootstrap_mean_interval, sign_flip_p_value

    values = [0.12, 0.08, 0.15, 0.11, 0.09, 0.14, 0.10, 0.13]
    expected = stats.bootstrap((np.array(values),), np.mean, n_resamples=10_000, method="percentile",
                               rng=5).confidence_interval
    assert bootstrap_mean_interval(values, seed=5) == pytest.approx((expected.low, expected.high), abs=1e-12)
    differences = [0.05, 0.02, -0.01, 0.04, 0.03, 0.06, -0.02, 0.01]
    exact = sum(abs(np.mean(np.array(differences) * signs)) >= abs(np.mean(differences)) - 1e-12
                for signs in np.array(np.meshgrid(*[[1, -1]] * 8)).T.reshape(-1, 8)) / 2 ** 8
    assert sign_flip_p_value(differences, seed=0) == pytest.approx(exact) == sign_flip_p_value(differences, seed=9)
    many = [0.01 * ((i * 7) % 11 - 4) for i in range(20)]
    mean = lambda x, axis: np.mean(x, axis=axis)  # noqa: E731
    monte_carlo = stats.permutation_test((np.array(many),), mean, vectorized=True, permutation_type="samples",
                                         n_resamples=10_000, rng=3).pvalue
    assert sign_flip_p_value(many, seed=3) == pytest.approx(monte_carlo)


def test_the_evaluation_bootstrap_se_is_scipys():
    import numpy as np
    from scipy import stats

    from cooper_openrlhf.eval.metrics import bootstrap_se

    values = [1.0, 0.0, 0.5, 0.25, 1.0, 0.75, 0.0, 0.5, 1.0, 0.25]
    expected = stats.bootstrap((np.array(values),), np.mean, n_resamples=1000, method="percentile", rng=3).standard_error
    assert bootstrap_se(values, resamples=1000, seed=3) == pytest.approx(expected, abs=1e-12)


# ------------------------------------------------------------------------------------- the prompt format
@pytest.mark.parametrize("row, reference", [
    ({"question": "What is 2 + 3?", "reference": "5"}, "5"),
    ({"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"}, "5"),  # GSM8K
    ({"question": "What is 2 + 3?", "answer": "5"}, "5"),
    ({"question": "What is 2 + 3?", "answer": 5}, "5"),
    ({"problem": "What is 2 + 3?", "answer": "5", "solution": "2 + 3 = 5", "level": "Level 1"}, "5"),  # MATH
    ({"Body": "Tom has 2 apples.", "Question": "He buys 3. How many?", "Answer": 5.0}, "5"),  # SVAMP
    ({"question": "What is 2 + 3?", "final_answer": ["$5$"]}, "5"),  # OlympiadBench
])
def test_the_prompt_step_reads_common_datasets_keys_without_a_format_flag(tmp_path, row, reference):
    from cooper_openrlhf.cluster import prompts

    source = tmp_path / "mine.jsonl"
    source.write_text(json.dumps(row) + "\n")
    assert prompts.main(["--input", str(source), "--out", str(tmp_path / "out.jsonl")]) == 0
    (written,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert written["answer"] == reference and written["question"].endswith(prompts.INSTRUCTIONS["gsm8k-verl"])


def test_a_row_of_unknown_keys_is_refused_with_the_format_and_an_example(tmp_path, capsys):
    from cooper_openrlhf.cluster import prompts

    source = tmp_path / "mine.jsonl"
    source.write_text(json.dumps({"text": "What is 2 + 3?", "label": "5"}) + "\n")
    assert prompts.main(["--input", str(source), "--out", str(tmp_path / "out.jsonl")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {source}:1: no known prompt keys (fields present: ['label', 'text'])")
    assert '{"question": "What is 2 + 3?", "reference": "5"}' in line


@pytest.mark.parametrize("row, message", [
    ({"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"},
     "a GSM8K file (row 1's 'answer' is a worked solution ending '#### ...', not a final answer); prepare it first: "
     "cooper prompts --input"),
    ({"problem": "What is 2 + 3?", "answer": "5"},
     "row 1 has no field 'question' (set by INPUT_KEY); fields present: ['answer', 'problem']. The rows are in the "
     "math500 format: prepare it first"),
])
def test_a_raw_dataset_file_given_as_prompts_points_to_the_prompt_step(rl_env, tmp_path, row, message):
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(row) + "\n" for _ in range(64)))
    with pytest.raises(PreflightError) as raised:
        plan_rl(Env({**rl_env, "PROMPTS": str(raw)}))
    assert message in str(raised.value)
