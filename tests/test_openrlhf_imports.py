"""Every module of the pinned OpenRLHF imports on this machine (CPU runtime installed by conftest)."""

import importlib
import pkgutil

import openrlhf
import pytest


def _openrlhf_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(openrlhf.__path__, prefix="openrlhf."))


def test_pinned_stack_versions():
    from importlib.metadata import version

    pins = {"openrlhf": "0.11.2", "deepspeed": "0.19.6", "ray": "2.55.0", "transformers": "5.15.0",
            "flash_attn": "2.8.3"}
    assert {name: version(name) for name in pins} == pins
    assert version("torch").startswith("2.13.0")


def test_module_list_covers_the_ray_trainer_and_cli():
    modules = _openrlhf_modules()
    for required in ("openrlhf.cli.train_ppo_ray", "openrlhf.trainer.ray.ppo_actor", "openrlhf.trainer.ray.launcher",
                     "openrlhf.trainer.ray.vllm_engine", "openrlhf.trainer.ray.vllm_worker_wrap",
                     "openrlhf.trainer.ppo_trainer", "openrlhf.models.model"):
        assert required in modules


@pytest.mark.parametrize("module", _openrlhf_modules())
def test_openrlhf_module_imports(module):
    importlib.import_module(module)
