"""Cooper's flags on OpenRLHF's parser, their cross-checks, and the start-up checks of train_cooper."""

import json

import pytest

from cooper_openrlhf.cli.cooper_args import CooperArgsError, add_cooper_args, validate_cooper_args

BASE = ["--actor.model_name_or_path", "policy", "--data.prompt_dataset", "prompts.jsonl", "--data.label_key", "label",
        "--vllm.num_engines", "1", "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4"]


@pytest.fixture(scope="module")
def parse():
    from cooper_openrlhf.runtime.openrlhf_args import openrlhf_ppo_parser, parse_openrlhf_args

    def parse(argv):
        return parse_openrlhf_args(argv, add_cooper_args(openrlhf_ppo_parser()))

    return parse


def _errors(args) -> str:
    with pytest.raises(CooperArgsError) as raised:
        validate_cooper_args(args)
    return str(raised.value)


def test_stock_flags_parse_unchanged_and_cooper_defaults_change_nothing(parse):
    from cooper_openrlhf.runtime.openrlhf_args import openrlhf_ppo_parser

    stock_argv = [*BASE, "--reward.model_name_or_path", "rm", "--ds.zero_stage", "3", "--actor.adam.lr", "5e-7"]
    stock = vars(openrlhf_ppo_parser().parse_args(stock_argv))
    extended = vars(add_cooper_args(openrlhf_ppo_parser()).parse_args(stock_argv))
    assert {k: v for k, v in extended.items() if k in stock} == stock
    assert set(extended) - set(stock) == {"remote_rm_trainable"} | {k for k in extended if k.startswith("cooper.")}
    args = parse(stock_argv)
    assert args.remote_rm_trainable is False
    assert (args.cooper.reward_source, args.cooper.reward_form, args.cooper.assistant) == ("rm", "continuous", "policy")
    assert args.cooper.rm_updates_per_step == 1 and args.cooper.negative_retries == 3
    validate_cooper_args(args)  # the static-RM arm


def test_cooper_flags_are_dotted_and_reach_the_nested_namespace(parse):
    args = parse([*BASE, "--reward.model_name_or_path", "rm", "--remote_rm_trainable", "--cooper.rm_lr", "3e-6",
                  "--cooper.reward_form", "discrete", "--cooper.reward_threshold", "0.7",
                  "--cooper.assistant", "model", "--cooper.assistant_model_path", "helper",
                  "--cooper.negative_retries", "5", "--cooper.rm_updates_per_step", "2"])
    validate_cooper_args(args)
    assert args.remote_rm_trainable and args.cooper.rm_lr == 3e-6 and args.cooper.reward_form == "discrete"
    assert args.cooper.reward_threshold == 0.7 and args.cooper.assistant_model_path == "helper"
    assert args.cooper.negative_retries == 5 and args.cooper.rm_updates_per_step == 2


def test_unknown_choices_are_rejected_by_the_parser(parse):
    for bad in (["--cooper.reward_form", "cubic"], ["--cooper.reward_source", "judge"], ["--cooper.rm_zero_stage", "3"]):
        with pytest.raises(SystemExit):
            parse([*BASE, *bad])


def test_the_rule_arm_needs_no_reward_model(parse):
    args = parse([*BASE, "--cooper.reward_source", "rule"])
    assert args.reward.model_name_or_path is None
    assert validate_cooper_args(args) is None  # accepted: raises CooperArgsError otherwise


@pytest.mark.parametrize("extra, message", [
    (["--remote_rm_trainable"], "--reward.model_name_or_path is required (--remote_rm_trainable trains it)"),
    ([], "--reward.model_name_or_path is required (--cooper.reward_source rm scores with it)"),
    (["--reward.model_name_or_path", "rm", "--remote_rm_trainable", "--reward.remote_url", "http://rm:5000"],
     "--reward.remote_url cannot be combined with Cooper"),
    (["--reward.model_name_or_path", "a,b"], "exactly one reward model"),
    (["--reward.model_name_or_path", "rm", "--algo.advantage.estimator", "gae"], "gae needs a critic"),
    (["--reward.model_name_or_path", "rm", "--train.async_enable"], "--train.async_enable is not supported"),
    (["--reward.model_name_or_path", "rm", "--cooper.assistant", "model"], "needs --cooper.assistant_model_path"),
    (["--reward.model_name_or_path", "rm", "--cooper.assistant", "model", "--cooper.assistant_model_path", "helper"],
     "--cooper.assistant model starts an engine for the RM's negatives, which only --remote_rm_trainable asks for"),
    (["--reward.model_name_or_path", "rm", "--cooper.assistant_model_path", "x"], "--cooper.assistant is 'policy'"),
    (["--reward.model_name_or_path", "rm", "--cooper.reward_threshold", "1.0"], "reward_threshold must be in (0, 1)"),
    (["--reward.model_name_or_path", "rm", "--remote_rm_trainable", "--cooper.rm_updates_per_step", "0"],
     "rm_updates_per_step must be >= 1"),
    (["--reward.model_name_or_path", "rm", "--cooper.rm_score_batch_size", "0"], "rm_score_batch_size must be >= 1"),
    (["--reward.model_name_or_path", "rm", "--cooper.rm_save_path", "out"], "only used with --remote_rm_trainable"),
    (["--reward.model_name_or_path", "rm", "--remote_rm_trainable", "--cooper.answerless_negatives"],
     "--cooper.answerless_negatives picks among the policy's own rollouts"),
])
def test_clashing_flags_fail_at_start_up_naming_them(parse, extra, message):
    assert message in _errors(parse([*BASE, *extra]))


def test_prompts_need_a_label_key_and_vllm_engines(parse):
    argv = [a for a in BASE if a not in ("--data.label_key", "label")]
    argv[argv.index("--vllm.num_engines") + 1] = "0"
    errors = _errors(parse([*argv, "--reward.model_name_or_path", "rm"]))
    assert "--data.label_key is required" in errors and "--vllm.num_engines >= 1 is required" in errors


def test_train_cooper_reuses_openrlhf_validation_block():
    from cooper_openrlhf.cli.train_cooper import parse_args

    args = parse_args([*BASE, "--reward.model_name_or_path", "rm", "--rollout.batch_size", "8", "--remote_rm_trainable"])
    # Set by the stock block under `__main__` in openrlhf/cli/train_ppo_ray.py, not by argparse.
    assert args.rollout.vllm_generate_batch_size == 8
    assert tuple(args.actor.eps_clip_low_high) == (0.2, 0.2)
    assert args.critic.model_name_or_path is None
    with pytest.raises(AssertionError, match="group_norm requires n_samples_per_prompt > 1"):  # a stock assertion
        parse_args([*BASE[:-2], "--reward.model_name_or_path", "rm", "--rollout.n_samples_per_prompt", "1"])
    with pytest.raises(CooperArgsError):  # Cooper's checks run first
        parse_args([*BASE, "--remote_rm_trainable"])


def _strategy(parse, dataset: str):
    from openrlhf.utils import get_strategy

    argv = [*BASE, "--reward.model_name_or_path", "rm"]
    argv[argv.index("--data.prompt_dataset") + 1] = dataset
    return get_strategy(parse([*argv, "--data.input_key", "question"]))


@pytest.mark.parametrize("bad_row, problem", [
    ({"question": "What is 1 + 1?"}, "field 'label' (--data.label_key) = 'None': missing"),
    ({"question": "What is 1 + 1?", "label": " "}, "field 'label' (--data.label_key) = ' ': empty"),
    ({"question": "What is 1 + 1?", "label": None}, "field 'label' (--data.label_key) = 'None': missing"),
    ({"question": "What is 1 + 1?", "label": "1 + 1 = <<1+1=2>>2\n#### 2"}, "a worked solution, not a final answer"),
    ({"question": [{"role": "system", "content": "hi"}], "label": "2"}, "not question text or a chat with a user turn"),
])
def test_a_prompt_row_without_a_reference_fails_at_start_naming_file_and_row(parse, tmp_path, bad_row, problem):
    from cooper_openrlhf.cli.train_cooper import check_prompt_dataset

    rows = [{"question": "What is 2 + 3?", "label": "5"}, {"question": "What is 4 * 4?", "label": 16}, bad_row]
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("".join(json.dumps(row) + "\n" for row in rows[:2]))
    bad.write_text("".join(json.dumps(row) + "\n" for row in rows))
    strategy = _strategy(parse, f"{good},{bad}")
    with pytest.raises(ValueError) as raised:
        check_prompt_dataset(strategy.args, strategy)
    assert f"prompt dataset {bad}, row 2 (0-based)" in str(raised.value) and problem in str(raised.value)
    good_strategy = _strategy(parse, str(good))
    check_prompt_dataset(good_strategy.args, good_strategy)  # integer labels are fine


def test_a_reward_model_path_that_is_not_a_sequence_classifier_fails_at_start(model_dir, tmp_path):
    from cooper_openrlhf.cli.train_cooper import check_reward_model
    from cooper_openrlhf.rm.model import NotASequenceClassifierError

    check_reward_model(model_dir("tiny-qwen2-rm"))
    with pytest.raises(NotASequenceClassifierError, match="not a sequence classifier"):
        check_reward_model(model_dir("tiny-qwen2-policy"))
    with pytest.raises(NotASequenceClassifierError, match="without config.json"):
        check_reward_model(str(tmp_path))


def test_the_step_benchmark_uses_only_flags_train_cooper_knows():
    """The launch scripts' flags are checked by train_cooper's own parser in tests/test_preflight.py."""
    from pathlib import Path
    from types import SimpleNamespace

    from cooper_openrlhf.runtime.openrlhf_args import openrlhf_ppo_parser

    known = set(add_cooper_args(openrlhf_ppo_parser())._option_string_actions)

    import importlib.util

    spec = importlib.util.spec_from_file_location("cooper_step_time", Path(__file__).resolve().parent.parent / "benchmarks" / "cooper_step_time.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = bench.train_cooper_argv(SimpleNamespace(policy="p", rm="r", max_new_tokens=8, temperature=0.3, n_samples=8,
                                                   policy_lr=0.0, dtype="auto", extra=[]), Path("x"), Path("y"))
    assert {a for a in argv if a.startswith("--")} - known == set()


RM_TRAINABLE = ["--reward.model_name_or_path", "rm", "--remote_rm_trainable"]


def test_a_gpu_run_refuses_the_cpu_only_options_naming_the_flag(parse):
    """Checked as on a GPU machine (cuda=True): the gloo weight sync and fp32 params are this package's CPU path."""
    from cooper_openrlhf.cli.cooper_args import device_problems

    gloo = parse([*BASE, *RM_TRAINABLE, "--vllm.sync_backend", "gloo"])
    assert any("--vllm.sync_backend gloo" in p for p in device_problems(gloo, cuda=True))
    assert device_problems(gloo, cuda=False) == []  # the CPU's own weight sync
    fp32 = parse([*BASE, *RM_TRAINABLE])
    fp32.ds.param_dtype = "fp32"  # what auto resolves to on a CPU without bf16 units
    assert any(p.startswith("--ds.param_dtype fp32") for p in device_problems(fp32, cuda=True))


def test_an_rm_optimizer_that_cannot_skip_a_non_finite_step_is_refused_at_start(parse):
    """RM ZeRO-1 + bf16 + fp32 gradient accumulation selects DeepSpeed's BF16_Optimizer, which asserts on the
    non-finite gradients the RM update relies on being skipped."""
    argv = [*BASE, *RM_TRAINABLE, "--cooper.rm_zero_stage", "1", "--ds.param_dtype", "bf16",
            "--ds.grad_accum_dtype", "fp32"]
    assert "--cooper.rm_zero_stage 1 with bf16 params and --ds.grad_accum_dtype fp32" in _errors(parse(argv))
    argv[argv.index("--cooper.rm_zero_stage") + 1] = "2"
    assert validate_cooper_args(parse(argv)) is None


def test_rm_updates_are_anchored_by_default_and_a_frozen_rm_is_not_asked_for_anchoring(parse):
    from cooper_openrlhf.rm.anchors import ANCHOR_WEIGHT

    trained = parse([*BASE, "--reward.model_name_or_path", "rm", "--remote_rm_trainable"])
    validate_cooper_args(trained)
    assert trained.cooper.rm_anchor_weight == ANCHOR_WEIGHT > 0
    validate_cooper_args(parse([*BASE, "--reward.model_name_or_path", "rm"]))  # the default asks nothing of a frozen RM
    asked = parse([*BASE, "--reward.model_name_or_path", "rm", "--cooper.rm_anchor_weight", "0.5"])
    assert "--cooper.rm_anchor_weight anchors the RM's updates, which need --remote_rm_trainable" in _errors(asked)
