"""The README's main job (`make demo` -> cooper_openrlhf.cli.demo): the lab's quick preset, flags passed through."""

from cooper_openrlhf.cli import demo, lab


def test_demo_is_the_labs_quick_preset_of_the_papers_three_arms():
    args = lab.parse_args(demo.demo_argv([]))
    assert args.preset == "quick" and args.preset_obj.arms == ("rule", "static", "cooper")
    assert args.preset_obj.seeds == 1 and args.out.name == "lab-quick"


def test_demo_passes_lab_flags_through(tmp_path):
    args = lab.parse_args(demo.demo_argv(["--out", str(tmp_path), "--steps", "3"]))
    assert args.out == tmp_path.resolve() and args.preset_obj.steps == 3


def test_cpu_settings_apply_only_where_torch_sees_no_cuda(monkeypatch):
    import torch

    from cooper_openrlhf.lab.runner import run_environment

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the CUDA boundary: a GPU machine
    on_gpu = run_environment()
    assert "DS_ACCELERATOR" not in on_gpu and "OMP_NUM_THREADS" not in on_gpu and on_gpu["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_environment()["DS_ACCELERATOR"] == "cpu"


def test_the_preparations_bce_stage_uses_every_core_unless_the_user_set_a_thread_count(monkeypatch):
    import torch

    from cooper_openrlhf.lab.prepare import bce_stage_environment
    from cooper_openrlhf.lab.runner import run_environment

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert run_environment()["OMP_NUM_THREADS"] == "1"  # an arm's processes: runs go side by side
    bce = bce_stage_environment()
    assert "OMP_NUM_THREADS" not in bce and bce["DS_ACCELERATOR"] == "cpu"  # the stage runs alone: torch's default
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert bce_stage_environment()["OMP_NUM_THREADS"] == "3"


def test_the_demos_runs_use_the_cpus_fast_dtype(tmp_path):
    from cooper_openrlhf.cli.train_cooper import parse_args
    from cooper_openrlhf.lab.presets import PRESETS
    from cooper_openrlhf.lab.runner import LabFiles, train_cooper_argv
    from cooper_openrlhf.runtime.dtype import resolve_dtype_name

    files = LabFiles(tmp_path, tmp_path / "policy", tmp_path / "rm")
    argv = train_cooper_argv(PRESETS[demo.DEMO_PRESET], files, "cooper", seed=0)
    assert "--ds.param_dtype" not in argv
    assert parse_args(argv[3:]).ds.param_dtype == resolve_dtype_name("auto")
