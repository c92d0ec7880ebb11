"""Shared fixtures. tests/ is not a package (the openrlhf wheel owns a top-level `tests`)."""

import os
import sys
from pathlib import Path

import pytest

# Set before anything imports transformers, DeepSpeed or vLLM; Ray workers inherit them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per CPU engine

from cooper_openrlhf.runtime import install_cpu_runtime  # noqa: E402
from cooper_openrlhf.runtime.dtype import announce_run_dtype, resolve_dtype_name  # noqa: E402
from cooper_openrlhf.runtime.toolchain import ready_for_op_builds  # noqa: E402

install_cpu_runtime()
ready_for_op_builds()  # as every CLI: the same ninja for DeepSpeed ops as the rest, no lock a killed build left
# What every entry point's start-up does: engines and Ray workers the tests start directly run in the CPU's fast
# dtype too (a process that announced none gets OpenRLHF's bf16, emulated and slow on CPUs without bf16 units).
announce_run_dtype(resolve_dtype_name("auto"))

REPO = Path(__file__).resolve().parent.parent
# Test helpers beside the tests (fake_cuda.py, ...) import by name; tests/ stays a plain folder (docstring above).
sys.path.insert(0, str(Path(__file__).resolve().parent))
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
def answering_policy(tmp_path_factory, model_dir) -> tuple[Path, list[dict]]:
    """(folder, prompt rows): the tiny policy fine-tuned to answer its prompts (test_cooper_e2e.py says why), made
    once for the end-to-end modules that launch it; they only read it."""
    from test_cooper_e2e import _answering_policy

    folder = tmp_path_factory.mktemp("answering_policy") / "policy"
    return folder, _answering_policy(folder, model_dir)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster for the whole session (start-up is seconds)."""
    import ray

    from cooper_openrlhf.runtime.ray_cluster import init_local_ray

    init_local_ray(log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def ray_cluster(ray_session):
    """The session's Ray cluster; the placement groups a test leaves behind are removed after it.

    OpenRLHF's `create_vllm_engines` and `RayActorGroup` reserve their "GPUs" in placement groups that killing
    the actors does not free. Left in place, they would use up the cluster's 8 logical GPUs over the session
    and a later test's actors would wait for resources forever.
    """
    from ray.util import placement_group_table

    before = set(placement_group_table())
    yield ray_session
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for group_id, info in placement_group_table().items():
        if group_id not in before and info["state"] != "REMOVED":
            remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(group_id))))


def pytest_runtest_logreport(report):
    """Print a failure's traceback as it happens, not only in the end summary: a CI run cut off by its time
    limit still shows what failed."""
    if report.failed and os.environ.get("CI"):
        import sys

        print(f"\n--- FAILED {report.nodeid} ({report.when}) ---\n{report.longreprtext[-4000:]}\n", file=sys.stderr,
              flush=True)
