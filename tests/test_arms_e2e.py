"""End to end: the static-RM and rule-reward arms of `python -m cooper_openrlhf.cli.train_cooper`, then the run report.

Each arm runs 2 GRPO steps of 4 prompts x 4 rollouts on a local CPU Ray cluster, with the launch pattern of
tests/test_cooper_e2e.py (tiny Qwen2 policy fine-tuned to answer its prompts, so the rule verifier finds
real correct and wrong rollouts; one CPU vLLM engine; DeepSpeed ZeRO-2 in the CPU's fast dtype; no reference model). What is
checked is what the runs leave on disk:
  static RM (no --remote_rm_trainable)  every logged reward is sigmoid(logit) of the frozen RM scoring that
                                        rollout directly; no RM checkpoint or export; the RM's files unchanged
  rule (--cooper.reward_source rule)    every logged reward is the rollout's verified flag (1.0 / 0.0)
Then `python -m cooper_openrlhf.cli.report` over both run folders writes the figures and a table whose
numbers equal the tensorboard scalars, read here independently with tensorboard's EventAccumulator.
The static arm also evaluates a held-out set every step (`eval/*/accuracy`); the rule arm does not, so
the table shows both of its paths (held-out, and the labelled fallback to verified accuracy).
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cooper_openrlhf.runtime.dtype import torch_dtype

pytestmark = pytest.mark.slow

PROMPTS = 8  # 4 per step, 2 steps
RM_MAX_LENGTH = 256


def _answering_policy(out: Path, model_dir) -> list[dict]:
    """The tiny policy fine-tuned for 40 full-batch AdamW steps to write "The answer is N." (as test_cooper_e2e)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cooper_openrlhf.data.synthetic import make_arithmetic_problems

    source = model_dir("tiny-qwen2-policy")
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    problems = make_arithmetic_problems(PROMPTS, seed=0, max_operand=20)
    encoded = []
    for problem in problems:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": problem.question}], tokenize=False,
                                               add_generation_prompt=True)
        target = f"The answer is {problem.reference}.{tokenizer.eos_token}"
        encoded.append((tokenizer(prompt)["input_ids"], tokenizer(target, add_special_tokens=False)["input_ids"]))
    width = max(len(p) + len(t) for p, t in encoded)
    ids = torch.full((len(encoded), width), tokenizer.pad_token_id)
    labels = torch.full((len(encoded), width), -100)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, (prompt, target) in enumerate(encoded):
        ids[row, : len(prompt) + len(target)] = torch.tensor(prompt + target)
        mask[row, : len(prompt) + len(target)] = 1
        labels[row, len(prompt) : len(prompt) + len(target)] = torch.tensor(target)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(40):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.to(torch_dtype("auto")).save_pretrained(out)  # the run's dtype: synced into vLLM unchanged
    tokenizer.save_pretrained(out)
    return [{"input": p.question, "label": p.reference} for p in problems]


def _launch(work: Path, policy: Path, *arm_flags: str) -> None:
    argv = [
        sys.executable, "-m", "cooper_openrlhf.cli.train_cooper", *arm_flags,
        "--actor.model_name_or_path", str(policy),
        "--data.prompt_dataset", str(work.parent / "prompts.jsonl"), "--data.input_key", "input",
        "--data.label_key", "label", "--data.apply_chat_template", "--data.max_len", "1024",
        "--rollout.max_new_tokens", "16", "--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", "4",
        "--rollout.micro_batch_size", "4", "--train.batch_size", "16", "--train.micro_batch_size", "4",
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
        "--vllm.num_engines", "1", "--vllm.sync_backend", "gloo", "--vllm.enforce_eager",
        "--ds.attn_implementation", "eager", "--ds.param_dtype", "auto", "--ds.zero_stage", "2",
        "--actor.num_gpus_per_node", "1", "--reward.num_gpus_per_node", "1",
        "--actor.adam.lr", "1e-4", "--actor.lr_warmup_ratio", "0", "--train.seed", "0",
        "--cooper.rm_max_length", str(RM_MAX_LENGTH),
        "--ckpt.save_steps", "1", "--ckpt.path", str(work / "ckpt"), "--ckpt.output_dir", str(work / "out"),
        "--logger.tensorboard_dir", str(work / "tb"), "--cooper.sample_log_dir", str(work / "samples"),
    ]
    env = {"HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    work.mkdir(parents=True)
    result = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    (work / "run.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]


def _digest(folder: str) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def arms(tmp_path_factory, model_dir) -> dict[str, Path]:
    """{"static": run folder, "rule": run folder}; the static RM's file digests before the run are saved beside it.

    The static run's folder is named `static_seed0` (the report reads arm and seed from it); the rule run's
    folder has a run_info.json instead, as the lab writes it.
    """
    root = tmp_path_factory.mktemp("arms_e2e")
    rows = _answering_policy(root / "policy", model_dir)
    (root / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (root / "held_out.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[:2]))
    rm = model_dir("tiny-qwen2-rm")
    before = _digest(rm)
    static, rule = root / "static_seed0", root / "rule_run"
    _launch(static, root / "policy", "--reward.model_name_or_path", rm, "--eval.dataset", str(root / "held_out.jsonl"),
            "--eval.steps", "1", "--eval.n_samples_per_prompt", "2")
    (root / "rm_digest_before.json").write_text(json.dumps(before))
    _launch(rule, root / "policy", "--cooper.reward_source", "rule")
    (rule / "run_info.json").write_text(json.dumps({"arm": "rule", "seed": 1}))
    return {"static": static, "rule": rule}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _scalars(run: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (log_dir,) = [p for p in (run / "tb").iterdir() if p.is_dir()]
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def test_static_rm_rewards_are_the_frozen_rms_scores_and_the_rm_is_never_trained_or_saved(arms, model_dir):
    from cooper_openrlhf.algo.negatives import normalize_solution
    from cooper_openrlhf.rm.model import load_rm, render_and_encode, rm_logits

    run = arms["static"]
    rollouts = _jsonl(run / "samples" / "rollouts.jsonl")
    assert sorted({r["step"] for r in rollouts}) == [1, 2] and len(rollouts) == 32
    model, tokenizer, version = load_rm(model_dir("tiny-qwen2-rm"), dtype=torch_dtype("auto"))  # the run's dtype
    completions = [normalize_solution(r["completion"]) for r in rollouts]  # as the trainer hands them to the RM
    batch = render_and_encode(tokenizer, [r["question"] for r in rollouts], [r["reference"] for r in rollouts],
                              completions, RM_MAX_LENGTH, version)
    with torch.no_grad():
        expected = torch.sigmoid(rm_logits(model.eval(), batch).float())
    # Both steps, including step 2 after a policy update: the RM that scored them is the initial one.
    torch.testing.assert_close(torch.tensor([r["reward"] for r in rollouts]), expected, atol=2e-3, rtol=0)
    assert len({round(r["reward"], 4) for r in rollouts}) > 1  # real scores, not a constant

    scalars = _scalars(run)
    for step in (1, 2):
        rewards = [r["reward"] for r in rollouts if r["step"] == step]
        assert scalars["train/cooper/rm_reward_mean"][step] == pytest.approx(sum(rewards) / 16, abs=1e-5)
    assert "train/cooper/rm_loss" not in scalars and "train/cooper/rm_updated" not in scalars
    assert not (run / "samples" / "pairs.jsonl").exists()  # no pairs are built for a frozen RM
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == ["_actor"]  # policy checkpoints only
    assert not list(run.rglob("*_rm_hf")) and not (run / "out" / "rm").exists()
    assert _digest(model_dir("tiny-qwen2-rm")) == json.loads((run.parent / "rm_digest_before.json").read_text())


def test_rule_arm_rewards_are_the_verified_flags_and_no_rm_metrics_exist(arms):
    run = arms["rule"]
    rollouts = _jsonl(run / "samples" / "rollouts.jsonl")
    assert sorted({r["step"] for r in rollouts}) == [1, 2] and len(rollouts) == 32
    assert [r["reward"] for r in rollouts] == [1.0 if r["verified"] else 0.0 for r in rollouts]
    assert {True, False} == {r["verified"] for r in rollouts}  # the fine-tuned policy is right and wrong
    scalars = _scalars(run)
    for step in (1, 2):
        verified = [r["verified"] for r in rollouts if r["step"] == step]
        assert scalars["train/cooper/verified_accuracy"][step] == pytest.approx(sum(verified) / 16, abs=1e-6)
        assert scalars["train/rollout/reward_mean"][step] == pytest.approx(sum(verified) / 16, abs=1e-6)
    assert not any(tag.startswith("train/cooper/rm_") or tag == "train/cooper/reward_hacking_gap" for tag in scalars)


def _alarms(run: Path) -> str:
    """The report's alarm column: no alarm is possible within the rule's first window (10 steps) of a 2-step run."""
    return "0" if "train/cooper/hacking_alarm" in _scalars(run) else "not monitored"


def test_the_report_over_both_arms_gives_the_tensorboard_numbers(arms, tmp_path):
    out = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.report", str(arms["static"]), str(arms["rule"]),
                             "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    for name in ("rewards_accuracy.png", "rm_pair_accuracy.png", "hacking_gap.png", "step_time.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    text = (out / "report.md").read_text()
    summary = {a["arm"]: a for a in json.loads((out / "summary.json").read_text())["arms"]}

    heldout = _scalars(arms["static"])["eval/accuracy"]  # the static arm evaluated at steps 1 and 2
    assert sorted(heldout) == [1, 2]
    final, best = heldout[2], max(heldout.values())
    assert f"| static | held-out accuracy | {final:.4f} (n=1) | {best:.4f} (n=1) |" in text
    assert summary["static"]["final_values"] == pytest.approx([final], abs=1e-7)
    assert summary["static"]["best_values"] == pytest.approx([best], abs=1e-7)

    verified = _scalars(arms["rule"])["train/cooper/verified_accuracy"]  # no held-out: the labelled fallback
    final, best = verified[2], max(verified.values())
    assert f"| rule | verified accuracy (training rollouts) | {final:.4f} (n=1) | {best:.4f} (n=1) |" in text
    assert summary["rule"]["final_values"] == pytest.approx([final], abs=1e-7)
    assert "No held-out accuracy for rule" in text

    gap = _scalars(arms["static"])["train/cooper/reward_hacking_gap"][2]
    assert f"| static | 0 | 2 (last 2) | {gap:+.4f} | {_alarms(arms['static'])} | ok | `{arms['static']}` |" in text
    assert f"| rule | 1 | 2 (last 2) | - | {_alarms(arms['rule'])} | ok | `{arms['rule']}` |" in text
    assert "| static | 0 | 2 | 32 |" in text and "| rule | 1 | 2 | 32 |" in text  # rollout logs of both runs
