"""Shared fixtures. tests/ is not a package (the openrlhf wheel owns a top-level `tests`)."""

import os
from pathlib import Path

import pytest

# Set before anything imports transformers, DeepSpeed or vLLM; Ray workers inherit them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per CPU engine

from cooper_openrlhf.runtime import install_cpu_runtime  # noqa: E402

install_cpu_runtime()

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent: benchmark files live beside the checkout, not in it")
    return SHARED_DATA


@pytest.fixture(scope="session")
def model_dir():
    """`model_dir("tiny-qwen2-rm")` -> materialised folder; a missing one fails naming the install step."""
    from cooper_openrlhf.models import model_path

    return model_path


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole session (start-up is seconds; actors are killed per test)."""
    import ray

    from cooper_openrlhf.runtime.ray_cluster import init_local_ray

    init_local_ray(log_to_driver=False)
    yield ray
    ray.shutdown()
