"""Secrets through the launchers: a wandb key or a reward-service token reaches no printed, logged or
recorded command (the Slurm bench of tests/launch_bench.py)."""

import json
from pathlib import Path

from launch_bench import _model, rl_env, shell

__all__ = ["rl_env", "shell"]  # the fixtures, used by name


def test_a_key_fed_through_every_printing_path_is_found_nowhere(shell, rl_env, tmp_path):
    """A wandb key (from WANDB_API_KEY, as wandb reads it, and one passed as a flag after the launcher) and a reward
    service token (`?token=` in --reward.remote_url) reach no printed, logged or recorded command: the dry run, the
    job's own output and Ray job log, launch.json, run_info.json, and the lab's command.txt, run_info.json and run
    log (which holds train_cooper's printed args)."""
    from cooper_openrlhf.lab.presets import PRESETS
    from cooper_openrlhf.lab.runner import LabFiles, run_arm

    env_key, flag_key, token = "envkey" + "0" * 34, "flagkey" + "1" * 33, "svctoken" + "2" * 24
    seen = []  # every text a user could copy somewhere

    dry = shell.run("cooper_slurm.sbatch", {**rl_env, "DRY_RUN": "1", "WANDB_API_KEY": env_key},
                    "--logger.wandb.key", flag_key)
    assert dry.returncode == 0, dry.stderr
    seen += [dry.stdout, dry.stderr]
    assert "--logger.wandb.key env:WANDB_API_KEY" in dry.stdout  # wandb on, the key left in the environment
    assert "--logger.wandb.key '***'" in dry.stdout and "ray job submit" in dry.stdout
    assert "export WANDB_API_KEY instead" in dry.stderr  # the note for a key given on the command line

    refused = shell.run("cooper_slurm.sbatch", {**rl_env, "DRY_RUN": "1"},
                        "--reward.remote_url", f"http://rm-host:5000/get_reward?token={token}")
    assert refused.returncode == 2  # Cooper's own RM replaces a remote one; the refusal shows no token either
    seen += [refused.stdout, refused.stderr]

    job_env = {**rl_env, "SLURM_JOB_ID": "91", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "gpu-a",
               "GPUS_PER_NODE": "4", "ARM": "rule", "WANDB_API_KEY": env_key}
    job = shell.run("cooper_slurm.sbatch", job_env, "--logger.wandb.key", flag_key)
    assert job.returncode == 0, job.stderr
    out = Path(rl_env["OUT"])
    launch = json.loads((out / "launch.json").read_text())
    assert launch["attempts"][0]["env"]["WANDB_API_KEY"] == "***"
    assert "***" in launch["attempts"][0]["command"] and "***" in launch["configuration"]
    seen += [job.stdout, job.stderr, (out / "launch.json").read_text(), (out / "run_info.json").read_text(),
             (out / "logs" / "job.log").read_text()]
    submitted = next(call for call in shell.calls("ray") if call[2:4] == ["job", "submit"])
    assert env_key not in " ".join(submitted)  # only the flag the user typed reaches Ray, and no record shows it

    files = LabFiles(root=tmp_path / "lab", policy=tmp_path / "lab" / "no-policy", rm=tmp_path / "lab" / "rm")
    info = run_arm(PRESETS["tiny"], files, "rule", seed=0, timeout_s=300,
                   extra_flags=("--logger.wandb.key", flag_key, "--logger.wandb.project", "p"))
    run = files.run_dir("rule", 0)
    log = Path(info["log"]).read_text()
    assert info["status"] == "failed" and "model folder does not exist" in log  # stopped at start-up...
    assert "'key': '***'" in log or "key='***'" in log  # ...after printing its args, the key redacted
    seen += [(run / "command.txt").read_text(), (run / "run_info.json").read_text(), log]
    assert "--logger.wandb.key ***" in seen[-3]

    leaks = [(index, secret) for index, text in enumerate(seen) for secret in (env_key, flag_key, token)
             if secret in text]
    assert not leaks, leaks


def test_the_verifyrm_train_launcher_takes_the_wandb_key_from_the_environment(shell, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "reference": "2", "completion": "2", "label": 1}) + "\n")
    env = {"PRETRAIN": _model(tmp_path / "base"), "DATA": str(data), "OUT": str(tmp_path / "rm"), "GPUS": "1",
           "RM_TRAIN_BATCH_SIZE": "4", "DRY_RUN": "1", "WANDB_API_KEY": "k" * 40}
    result = shell.run("verifyrm_train.sbatch", env)
    assert result.returncode == 0, result.stderr
    assert "--logger.wandb.key env:WANDB_API_KEY" in result.stdout and "k" * 40 not in result.stdout + result.stderr
