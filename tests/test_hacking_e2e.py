"""The reward-hacking guard in a real (tiny) run: `--cooper.on_hacking stop` saves the alarm step's checkpoint and
ends the run with an error. (`rule_reward`'s switch is the trainer's own code, run with fake actor handles in
tests/test_cooper_trainer_step.py; the rule verifier's pay through the real experience maker is the lab's rule arm
in tests/test_lab_e2e.py.)

A hacking-shaped run on purpose: the untrained tiny policy never states a verifiable answer (verified
accuracy 0) while the frozen tiny RM pays about 0.5 per rollout, so the gap RM reward - verified accuracy
sits near 0.5. With a 3-step window and a gap ceiling of 0.3 the alarm turns on at step 3 of 4.
Static-RM arm (nothing of Cooper's negatives is needed), one CPU vLLM engine, no reference model.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STEPS = 4
ALARM = ("--cooper.hacking_window", "3", "--cooper.hacking_gap_ceiling", "0.3")


def _scalars(run: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (log_dir,) = [p for p in (run / "tb").iterdir() if p.is_dir()]
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def _run(work: Path, model_dir, on_hacking: str) -> subprocess.CompletedProcess:
    from cooper_openrlhf.data.synthetic import make_arithmetic_problems

    work.mkdir(parents=True)
    rows = [{"input": p.question, "label": p.reference} for p in make_arithmetic_problems(4 * STEPS, seed=0)]
    (work / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = [
        sys.executable, "-m", "cooper_openrlhf.cli.train_cooper",
        "--actor.model_name_or_path", model_dir("tiny-qwen2-policy"), "--reward.model_name_or_path",
        model_dir("tiny-qwen2-rm"), "--data.prompt_dataset", str(work / "prompts.jsonl"), "--data.input_key", "input",
        "--data.label_key", "label", "--data.apply_chat_template", "--data.max_len", "512",
        "--rollout.max_new_tokens", "8", "--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "4",
        "--rollout.micro_batch_size", "4", "--train.batch_size", "8", "--train.micro_batch_size", "4",
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0", "--vllm.num_engines", "1",
        "--vllm.sync_backend", "gloo", "--vllm.enforce_eager", "--ds.attn_implementation", "eager",
        "--ds.zero_stage", "2", "--actor.num_gpus_per_node", "1", "--reward.num_gpus_per_node", "1",
        "--cooper.rm_max_length", "256", "--train.seed", "0", "--ckpt.path", str(work / "ckpt"),
        "--ckpt.output_dir", str(work / "out"), "--logger.tensorboard_dir", str(work / "tb"),
        "--cooper.sample_log_dir", str(work / "samples"), "--cooper.on_hacking", on_hacking, *ALARM,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    (work / "run.log").write_text(result.stdout + result.stderr)
    return result


def test_stop_saves_the_alarm_steps_checkpoint_and_ends_the_run_with_an_error(tmp_path, model_dir):
    result = _run(tmp_path / "stop", model_dir, "stop")
    log = result.stdout + result.stderr
    assert result.returncode != 0, log[-3000:]
    assert "reward hacking suspected at step 3" in log and "HackingAlarm" in log, log[-3000:]
    actor_ckpt = tmp_path / "stop" / "ckpt" / "_actor"
    assert (actor_ckpt / "global_step3").is_dir()  # saved although --ckpt.save_steps is off
    assert not (actor_ckpt / "global_step4").exists()
    scalars = _scalars(tmp_path / "stop")
    assert scalars["train/cooper/hacking_alarm"] == {1: 0.0, 2: 0.0, 3: 1.0}
