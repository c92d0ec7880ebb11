"""End to end: `python -m cooper_openrlhf.cli.train_cooper --remote_rm_trainable` on a local CPU Ray cluster.

Tiny Qwen2 policy and RM, one CPU vLLM engine, DeepSpeed ZeRO-2 in the CPU's fast dtype (--ds.param_dtype auto), 3 Cooper steps of 4 prompts x 4
rollouts, a checkpoint every step; then a second launch resumes from the step-2 checkpoint and runs step 3.
Everything is checked from what the runs leave on disk: tensorboard scalars (OpenRLHF's logger), the
per-step rollouts and pairs (`--cooper.sample_log_dir`), DeepSpeed checkpoints and the RM exports.

Why the positives are real: the tiny random policy almost never writes a verifiable answer. Rather than
faking the verifier or injecting pairs, the test first fine-tunes that policy to answer its 12 prompts
(`models.answering.fine_tune_to_answer`, about 15 s), so the rule verifier finds genuine positives and the
policy itself, as the default assistant, rewrites them into answers the verifier proves different: the whole
Cooper path runs unchanged, nothing is stubbed. Rollouts are random,
so the assertions hold for any draw in which some prompt has a positive, which at this accuracy is all of
them in practice.

The reference model is left out (`--algo.kl.init_coef 0`): it is stock OpenRLHF, and skipping it saves a
DeepSpeed start-up per launch on two cores.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cooper_openrlhf.runtime.dtype import torch_dtype

pytestmark = pytest.mark.slow

STEPS = 3
PROMPTS = 12  # 4 per step
RM_MAX_LENGTH = 256


def _answering_policy(out: Path, model_dir) -> list[dict]:
    """The tiny policy fine-tuned to answer its prompts (see the module docstring); returns the prompt rows."""
    from cooper_openrlhf.data.synthetic import make_arithmetic_problems
    from cooper_openrlhf.models.answering import fine_tune_to_answer

    problems = make_arithmetic_problems(PROMPTS, seed=0, max_operand=20)
    fine_tune_to_answer(model_dir("tiny-qwen2-policy"), out, [(p.question, p.reference) for p in problems],
                        torch_dtype("auto"))
    return [{"input": p.question, "label": p.reference} for p in problems]


def _launch(work: Path, policy: Path, rm: str, *extra: str, trainable: bool = True) -> subprocess.CompletedProcess:
    argv = [
        sys.executable, "-m", "cooper_openrlhf.cli.train_cooper", *(["--remote_rm_trainable"] if trainable else []),
        "--actor.model_name_or_path", str(policy), "--reward.model_name_or_path", rm,
        "--data.prompt_dataset", str(work.parent / "prompts.jsonl"), "--data.input_key", "input",
        "--data.label_key", "label", "--data.apply_chat_template", "--data.max_len", "1024",
        "--rollout.max_new_tokens", "16", "--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", "4",
        "--rollout.micro_batch_size", "4", "--train.batch_size", "16", "--train.micro_batch_size", "4",
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
        "--vllm.num_engines", "1", "--vllm.sync_backend", "gloo", "--vllm.enforce_eager",
        "--ds.attn_implementation", "eager", "--ds.zero_stage", "2",
        "--actor.num_gpus_per_node", "1", "--reward.num_gpus_per_node", "1",
        "--actor.adam.lr", "1e-4", "--actor.lr_warmup_ratio", "0", "--train.seed", "0",
        "--cooper.rm_lr", "1e-3", "--cooper.rm_warmup_ratio", "0", "--cooper.rm_max_length", str(RM_MAX_LENGTH),
        "--cooper.negative_max_new_tokens", "16",
        "--ckpt.save_steps", "1", "--ckpt.save_hf", "--ckpt.max_num", "5", "--ckpt.path", str(work / "ckpt"),
        "--ckpt.output_dir", str(work / "out"), "--logger.tensorboard_dir", str(work / "tb"),
        "--cooper.sample_log_dir", str(work / "samples"), *extra,
    ]
    env = {"HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    (work / "run.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    return result


@pytest.fixture(scope="module")
def prompts_and_policy(tmp_path_factory, answering_policy) -> Path:
    root = tmp_path_factory.mktemp("cooper_e2e")
    policy, rows = answering_policy
    (root / "policy").symlink_to(policy)
    (root / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


@pytest.fixture(scope="module")
def runs(prompts_and_policy, model_dir):
    """(first run: 3 steps, resumed run: step 3 again from the step-2 checkpoint, initial policy path)."""
    root = prompts_and_policy
    first, resumed = root / "first", root / "resumed"
    _launch(first, root / "policy", model_dir("tiny-qwen2-rm"))
    # Resume from step 2: its policy and RM checkpoints, marked latest as DeepSpeed does.
    for part in ("_actor", "_rm"):
        (resumed / "ckpt" / part).mkdir(parents=True)
        shutil.copytree(first / "ckpt" / part / "global_step2", resumed / "ckpt" / part / "global_step2")
        (resumed / "ckpt" / part / "latest").write_text("global_step2")
    _launch(resumed, root / "policy", model_dir("tiny-qwen2-rm"), "--ckpt.load_enable")
    return first, resumed, root / "policy"


def _scalars(run: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (log_dir,) = [p for p in (run / "tb").iterdir() if p.is_dir()]
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _rm(path: str):
    from cooper_openrlhf.rm.model import load_rm

    model, tokenizer, version = load_rm(path, dtype=torch_dtype("auto"))
    return model.eval(), tokenizer, version


def _logits(rm, questions, references, completions) -> torch.Tensor:
    """The RM's logits of the texts, as the trainer's RM reads them (its template normalises each completion)."""
    from cooper_openrlhf.rm.model import render_and_encode, rm_logits

    model, tokenizer, version = rm
    with torch.no_grad():
        return rm_logits(model, render_and_encode(tokenizer, questions, references, completions, RM_MAX_LENGTH, version))


def _rm_after(run: Path, step: int, model_dir) -> str:
    """The RM that scored step `step + 1`: the initial one, or the export saved with checkpoint `step`."""
    return model_dir("tiny-qwen2-rm") if step == 0 else str(run / "ckpt" / f"global_step{step}_rm_hf")


def _safetensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def test_three_steps_log_the_cooper_metrics_through_openrlhfs_logger(runs):
    first, _, _ = runs
    scalars = _scalars(first)
    for key in ("cooper/valid_pair_rate", "cooper/negative_success_rate", "cooper/rm_updated", "cooper/rm_reward_mean",
                "cooper/verified_accuracy", "cooper/reward_hacking_gap", "timing/cooper_verify",
                "cooper/negatives_seconds", "timing/cooper_score", "timing/cooper_rm_update", "timing/ppo_train"):
        assert sorted(scalars[f"train/{key}"]) == [1, 2, 3], key
    updated = [step for step, value in scalars["train/cooper/rm_updated"].items() if value]
    for key in ("cooper/rm_loss", "cooper/rm_pair_accuracy", "cooper/rm_grad_norm"):  # steps with valid pairs
        assert sorted(scalars[f"train/{key}"]) == sorted(updated), key
    for step in (1, 2, 3):
        gap = scalars["train/cooper/rm_reward_mean"][step] - scalars["train/cooper/verified_accuracy"][step]
        assert scalars["train/cooper/reward_hacking_gap"][step] == pytest.approx(gap, abs=1e-5)
        rollouts = [r for r in _jsonl(first / "samples" / "rollouts.jsonl") if r["step"] == step]
        assert len(rollouts) == 16
        accuracy = sum(r["verified"] for r in rollouts) / 16
        assert scalars["train/cooper/verified_accuracy"][step] == pytest.approx(accuracy, abs=1e-6)
        for key, verified in (("rm_reward_wrong_mean", False), ("rm_reward_correct_mean", True)):  # rule F's input
            paid = [r["reward"] for r in rollouts if r["verified"] == verified]
            if paid:
                assert scalars[f"train/cooper/{key}"][step] == pytest.approx(sum(paid) / len(paid), abs=1e-5)
            else:
                assert step not in scalars.get(f"train/cooper/{key}", {})


def test_both_the_policy_and_the_reward_model_weights_change(runs, model_dir):
    first, _, policy = runs
    initial_policy, final_policy = _safetensors(policy), _safetensors(first / "out")
    assert any(not torch.equal(initial_policy[k], final_policy[k]) for k in initial_policy)
    initial_rm, final_rm = _safetensors(model_dir("tiny-qwen2-rm")), _safetensors(first / "out" / "rm")
    assert initial_rm.keys() == final_rm.keys()
    assert any(not torch.equal(initial_rm[k], final_rm[k]) for k in initial_rm)


@pytest.fixture(scope="module")
def mixed_run(prompts_and_policy, model_dir) -> Path:
    """3 steps with mixed negatives (wrong rollouts first, the assistant's rewrites for the gaps; the rollout-only
    source is that choice without the gap filling: tests/test_pairs_builder.py). Two policy optimizer steps per
    rollout step (train batch 8 of 16 rollouts), so OpenRLHF's max_steps (6) is twice the rollout steps (3) that
    the RM's linear schedule must span."""
    root = prompts_and_policy
    from cooper_openrlhf.data.synthetic import make_arithmetic_problems

    held_out = make_arithmetic_problems(3, seed=1, max_operand=20)
    (root / "held_out.jsonl").write_text("".join(json.dumps({"input": p.question, "label": p.reference}) + "\n"
                                                for p in held_out))
    train_rows = _jsonl(root / "prompts.jsonl")[:4]
    verifier_rows = [{"question": r["input"], "answer": r["label"], "completion": f"The answer is {answer}.",
                      "gold_correct": answer == r["label"]}
                     for r in train_rows for answer in (r["label"], str(int(r["label"]) + 1))]
    (root / "verify.jsonl").write_text("".join(json.dumps(row) + "\n" for row in verifier_rows))
    evaluation = ("--eval.dataset", str(root / "held_out.jsonl"), "--eval.steps", "1", "--eval.n_samples_per_prompt", "2",
                  "--cooper.rm_eval_dataset", str(root / "verify.jsonl"))
    _launch(root / "mixed", root / "policy", model_dir("tiny-qwen2-rm"), "--cooper.negative_source", "mixed",
            "--train.batch_size", "8", "--cooper.rm_lr_scheduler", "linear", *evaluation)
    return root / "mixed"


def _all_runs(runs, mixed_run) -> dict[str, Path]:
    return {"assistant": runs[0], "mixed": mixed_run}


@pytest.mark.parametrize("source", ["assistant", "mixed"])
def test_the_rm_loss_is_the_masked_mean_over_exactly_the_valid_pairs(runs, mixed_run, source, model_dir):
    first = _all_runs(runs, mixed_run)[source]
    scalars = _scalars(first)
    pairs = _jsonl(first / "samples" / "pairs.jsonl")
    trained_steps = 0
    for step in (1, 2, 3):
        slots = [p for p in pairs if p["step"] == step]
        valid = [p for p in slots if p["valid"]]
        assert len(slots) == 4
        assert scalars["train/cooper/valid_pair_rate"][step] == pytest.approx(len(valid) / 4)
        if not valid:
            assert scalars["train/cooper/rm_updated"][step] == 0.0
            continue
        trained_steps += 1
        assert scalars["train/cooper/rm_valid_pairs"][step] == len(valid)
        from cooper_openrlhf.algo.losses import pairwise_rm_loss

        rm = _rm(_rm_after(first, step - 1, model_dir))
        args = ([p["question"] for p in valid], [p["reference"] for p in valid])
        loss, _ = pairwise_rm_loss(_logits(rm, *args, [p["positive"] for p in valid]),
                                   _logits(rm, *args, [p["negative"] for p in valid]), torch.ones(len(valid), dtype=torch.bool))
        assert scalars["train/cooper/rm_loss"][step] == pytest.approx(loss.item(), abs=1e-4), step
    assert trained_steps >= (2 if source == "assistant" else 1)  # positives and negatives were found on most steps


def test_rollout_negatives_are_wrong_rollouts_of_the_same_step_and_prompt(mixed_run):
    run = mixed_run  # wrong rollouts first, the assistant's rewrites only for the prompts without one
    rollouts, pairs = _jsonl(run / "samples" / "rollouts.jsonl"), _jsonl(run / "samples" / "pairs.jsonl")
    scalars = _scalars(run)
    from cooper_openrlhf.algo.negatives import normalize_solution

    from_rollouts = [p for p in pairs if p["valid"] and p["negative_source"] == "rollout"]
    assert from_rollouts, "no rollout negative in 3 steps: the tiny policy is wrong on a fair share of its rollouts"
    for pair in from_rollouts:
        same_prompt = [r for r in rollouts if r["step"] == pair["step"] and r["question"] == pair["question"]]
        wrong = [normalize_solution(r["completion"]) for r in same_prompt if not r["verified"]]
        assert pair["negative"] in wrong
    assert {p["negative_source"] for p in pairs if p["valid"]} <= {"rollout", "assistant"}
    for step in (1, 2, 3):
        valid = [p for p in pairs if p["step"] == step and p["valid"]]
        if valid:
            share = sum(p["negative_source"] == "rollout" for p in valid) / len(valid)
            assert scalars["train/cooper/pairs_from_rollout"][step] == pytest.approx(share)


def test_held_out_accuracy_and_the_rms_verifier_accuracy_are_logged_every_eval_step(prompts_and_policy, mixed_run,
                                                                                     model_dir):
    run = mixed_run
    scalars = _scalars(run)
    assert sorted(scalars["eval/accuracy"]) == [1, 2, 3]
    per_source = [key for key in scalars if key.startswith("eval/") and key.endswith("/accuracy") and key != "eval/accuracy"]
    assert per_source, sorted(scalars)
    for step, value in scalars["eval/accuracy"].items():
        assert 0.0 <= value <= 1.0
        assert scalars[per_source[0]][step] == pytest.approx(value, abs=1e-6)  # one datasource: the same share
    rows = _jsonl(prompts_and_policy / "verify.jsonl")
    for step in (1, 2, 3):
        rm = _rm(_rm_after(run, step, model_dir))  # the RM after the step's update
        logits = _logits(rm, [r["question"] for r in rows], [r["answer"] for r in rows], [r["completion"] for r in rows])
        accuracy = sum(bool(p) == r["gold_correct"] for p, r in zip((torch.sigmoid(logits) >= 0.5).tolist(), rows))
        assert scalars["train/cooper/rm_eval_accuracy"][step] == pytest.approx(accuracy / len(rows)), step


def test_the_rm_scores_the_held_out_rollouts_and_the_held_out_gap_is_logged(mixed_run, model_dir):
    from cooper_openrlhf.algo.hacking_stats import heldout_rm_gap

    run = mixed_run
    scalars, heldout = _scalars(run), _jsonl(run / "samples" / "heldout.jsonl")
    for step in (1, 2, 3):
        rows = [r for r in heldout if r["step"] == step]
        assert rows and sum(r["verified"] for r in rows) / len(rows) == pytest.approx(scalars["eval/accuracy"][step])
        # what the RM after the step's update pays them (the evaluation follows the update)
        rm = _rm(_rm_after(run, step, model_dir))
        paid = torch.sigmoid(_logits(rm, [r["question"] for r in rows], [r["reference"] for r in rows],
                                     [r["completion"] for r in rows]))
        assert [r["reward"] for r in rows] == pytest.approx(paid.tolist(), abs=1e-3), step
        expected = heldout_rm_gap([r["question"] for r in rows], [r["verified"] for r in rows], paid.tolist())
        for key, value in expected.items():
            assert scalars[f"eval/{key}"][step] == pytest.approx(value, abs=1e-3), (step, key)


def test_the_rm_schedule_spans_the_rollout_steps_not_the_policy_optimizer_steps(mixed_run):
    scalars = _scalars(mixed_run)
    rm_lr = 1e-3  # _launch's --cooper.rm_lr, decayed linearly over 3 rollout steps (max_steps would be 6)
    for step, lr in scalars["train/cooper/rm_lr"].items():
        optimizer_steps = scalars["train/cooper/rm_optimizer_steps"][step]
        assert lr == pytest.approx(rm_lr * (1 - optimizer_steps / 3), abs=1e-7), (step, optimizer_steps)


def test_step_two_rewards_come_from_the_rm_updated_at_step_one(runs, model_dir):
    first, _, _ = runs
    rollouts = [r for r in _jsonl(first / "samples" / "rollouts.jsonl") if r["step"] == 2]
    texts = ([r["question"] for r in rollouts], [r["reference"] for r in rollouts], [r["completion"] for r in rollouts])
    logged = torch.tensor([r["reward"] for r in rollouts])
    updated = torch.sigmoid(_logits(_rm(_rm_after(first, 1, model_dir)), *texts))
    torch.testing.assert_close(logged, updated, atol=1e-3, rtol=0)
    if _scalars(first)["train/cooper/rm_updated"][1]:  # step 1 had valid pairs (nearly always)
        initial = torch.sigmoid(_logits(_rm(_rm_after(first, 0, model_dir)), *texts))
        assert (logged - initial).abs().max() > 1e-3  # ...and not from the RM before its update


def _rm_checkpoint(run: Path, step: int) -> tuple[dict, dict]:
    """(model states incl. client state, optimizer states) of the RM's DeepSpeed checkpoint at `step`."""
    folder = run / "ckpt" / "_rm" / f"global_step{step}"
    (model_file,) = folder.glob("*model_states.pt")
    (optim_file,) = folder.glob("*optim_states.pt")
    return (torch.load(model_file, map_location="cpu", weights_only=False),
            torch.load(optim_file, map_location="cpu", weights_only=False)["optimizer_state_dict"])


def test_resuming_from_the_step_two_checkpoint_restores_rm_weights_optimizer_and_step(runs, model_dir):
    first, resumed, _ = runs
    scalars = _scalars(resumed)
    assert sorted(scalars["train/cooper/rm_optimizer_steps"]) == [3]  # the resumed run went on at step 3

    # Weights: step 3's rewards are those of the RM saved at step 2.
    rollouts = _jsonl(resumed / "samples" / "rollouts.jsonl")
    assert {r["step"] for r in rollouts} == {3}
    texts = ([r["question"] for r in rollouts], [r["reference"] for r in rollouts], [r["completion"] for r in rollouts])
    torch.testing.assert_close(torch.tensor([r["reward"] for r in rollouts]),
                               torch.sigmoid(_logits(_rm(_rm_after(first, 2, model_dir)), *texts)), atol=1e-3, rtol=0)

    # Step count and optimizer: the resumed run's step-3 checkpoint continues the step-2 state.
    saved_model, saved_optim = _rm_checkpoint(first, 2)
    new_model, new_optim = _rm_checkpoint(resumed, 3)
    applied = int(scalars["train/cooper/rm_updated"][3])
    assert saved_model["cooper_rm_counters"]["optimizer_steps"] == scalars["train/cooper/rm_optimizer_steps"][3] - applied
    assert new_model["cooper_rm_counters"]["optimizer_steps"] == saved_model["cooper_rm_counters"]["optimizer_steps"] + applied
    assert new_model["global_steps"] == saved_model["global_steps"] + applied
    assert new_model["lr_scheduler"]["last_epoch"] == saved_model["lr_scheduler"]["last_epoch"] + applied
    for group, state in saved_optim["base_optimizer_state"]["state"].items():
        restored = new_optim["base_optimizer_state"]["state"][group]
        assert int(restored["step"]) == int(state["step"]) + applied
        # Adam's second moment decays by beta2 = 0.95 per step and only grows otherwise: a fresh optimizer
        # (no restored moments) would fall below this wherever step 3's gradient is small.
        assert (restored["exp_avg_sq"] >= 0.95 * state["exp_avg_sq"] * (1 - 1e-4)).all()


# ----------------------------------------------------------------------------- resume after a best save
@pytest.fixture(scope="module")
def best_resume(prompts_and_policy, model_dir) -> tuple[Path, dict]:
    """A run whose last checkpoint is a best save off --ckpt.save_steps, then started again with the same
    command, as a requeued job is (the launcher always passes --ckpt.load_enable). The held-out evaluation runs at
    step 2 and its best-metric key is one every evaluation gives the same value (`samples`), so the best save is
    exactly step 2's: OpenRLHF saves the policy as best_global_step2 only and points `latest` there.
    Returns (the run folder, {model: (its checkpoint tags, its `latest`)} after the first launch)."""
    from cooper_openrlhf.data.synthetic import make_arithmetic_problems

    root = prompts_and_policy
    held_out = root / "best_held_out.jsonl"
    held_out.write_text("".join(json.dumps({"input": p.question, "label": p.reference}) + "\n"
                                for p in make_arithmetic_problems(2, seed=2, max_operand=20)))
    run = root / "best"
    flags = ("--eval.dataset", str(held_out), "--eval.steps", "2", "--eval.n_samples_per_prompt", "1",
             "--ckpt.best_metric_key", "samples", "--ckpt.save_steps", "100", "--ckpt.load_enable")
    _launch(run, root / "policy", model_dir("tiny-qwen2-rm"), *flags)
    (run / "run.log").rename(run / "first.log")
    state = {model: ([tag.name for tag in sorted((run / "ckpt" / model).iterdir()) if tag.is_dir()],
                     (run / "ckpt" / model / "latest").read_text().strip()) for model in ("_actor", "_rm")}
    _launch(run, root / "policy", model_dir("tiny-qwen2-rm"), *flags)  # the requeued job
    return run, state


def test_a_run_requeued_after_a_best_save_resumes_with_the_rm_of_that_step(best_resume):
    from cooper_openrlhf.cluster.launch_record import check_last_checkpoint
    from cooper_openrlhf.cluster.run_checks import resumed_rm_problems
    from cooper_openrlhf.ray.run_logs import read_scalars

    run, state = best_resume
    # The state a requeue after a best save meets: the only checkpoint is step 2's best one, and 2 is no save step.
    assert state == {model: (["best_global_step2"], "best_global_step2") for model in ("_actor", "_rm")}
    # The preflight judges it as the trainer resumes: both models from best_global_step2.
    assert check_last_checkpoint(str(run / "ckpt"))[0] == [str(run / "ckpt" / m / "best_global_step2")
                                                           for m in ("_actor", "_rm")]
    assert "resumed the Cooper RM from best_global_step2" in (run / "run.log").read_text()
    # The requeued job's step 3 was paid by the RM saved with the best policy, the RM after step 2's update...
    assert resumed_rm_problems(run, run / "ckpt", "best_global_step2", dtype=torch_dtype("auto")) == []
    # ...and its optimizer-step count went on from the checkpoint's (a fresh RM would have counted from 0). The
    # count the checkpoint holds is the one after the RM guard: an update it rolled back restored the count too, so
    # it is read from the resume's log line, not from step 2's logged (pre-guard) value.
    resumed = re.search(r"resumed the Cooper RM from best_global_step2 .*'optimizer_steps': (\d+)",
                        (run / "run.log").read_text())
    scalars = {name: dict(series) for name, series in read_scalars(run).items()}  # step 3: the requeued job's
    steps, updated = scalars["cooper/rm_optimizer_steps"], scalars["cooper/rm_updated"]
    assert resumed and int(resumed[1]) >= 1, "no RM update kept in steps 1-2: nothing to carry over"
    assert steps[3] == int(resumed[1]) + updated[3]


def test_the_gpu_smoke_checks_pass_the_cpu_runs_logs_and_fail_a_step_paid_by_another_rm(runs, best_resume, tmp_path,
                                                                                         model_dir):
    """The checks behind `gpu_smoke`'s PASS (cluster/run_checks.py) on real CPU runs: the first run (pairs, rewrites,
    RM updates, an RM export every step) passes; told that the RM saved after each step was the initial one, the
    check finds the next step paid by another RM and says so. The requeued run passes the resume check, and fails
    it against the initial RM."""
    from cooper_openrlhf.cluster.run_checks import cooper_path_problems, resumed_rm_problems

    first, _, _ = runs
    assert cooper_path_problems(first, first / "ckpt", dtype=torch_dtype("auto")) == []
    initial = tmp_path / "ckpt"
    initial.mkdir()
    for step in (1, 2, 3):
        (initial / f"global_step{step}_rm_hf").symlink_to(model_dir("tiny-qwen2-rm"))
        (initial / f"best_global_step{step}_rm_hf").symlink_to(model_dir("tiny-qwen2-rm"))
    problems = cooper_path_problems(first, initial, dtype=torch_dtype("auto"))
    assert problems and all("was not paid by the RM updated at step" in p for p in problems), problems
    run, _ = best_resume
    assert resumed_rm_problems(run, run / "ckpt", "best_global_step2", dtype=torch_dtype("auto")) == []
    (problem,) = resumed_rm_problems(run, initial, "best_global_step2", dtype=torch_dtype("auto"))
    assert "step 3 after the resume was not paid by the RM of best_global_step2" in problem
    # The smoke's resume_best stage runs the same two launches into the same layout; its whole check, on their log:
    from cooper_openrlhf.cli.gpu_smoke import BEST_TAG, stage_problems

    assert BEST_TAG == "best_global_step2"
    log = (run / "first.log").read_text() + (run / "run.log").read_text()
    assert stage_problems("resume_best", run, log, atol=1e-3, dtype=torch_dtype("auto")) == []
    assert stage_problems("resume_best", run, (run / "first.log").read_text(), atol=1e-3, dtype=torch_dtype("auto"))
