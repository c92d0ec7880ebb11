"""The demo's starting point made once, at install: the quick preset's task files, warm-started policy and starting
VerifyRM (lab/prepare.py), so that `make demo` spends its minutes on the arms.

    python -m cooper_openrlhf.lab.prepared            # scripts/install.sh's last step; seconds when it is current

The preparation is most of a demo's time on a 2-core CPU (docs/lab.md, "Where the demo's time goes") and the same for
every demo of one machine and one version of the code: the install makes it under
`models_dir()/prepared/lab-quick-<dtype>/`, and a lab whose folder holds no preparation yet starts from a copy of it
(`copy_prepared`) when its key matches. The key is what the preparation's bytes depend on: the preset's settings (as
lab_settings.json records them), the CPU's dtype (bf16 units or not, `COOPER_CPU_BF16`), and the source of the
modules that compute it. Anything else -- another preset, `--preparation-seed 1`, an edited warm start -- has
another key, and that lab prepares itself as before.
"""

import hashlib
import json
import logging
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

logger = logging.getLogger(__name__)

KEY_FILE = "prepared_key.json"  # written last: a store without it is unfinished
PARTS = ("data", "policy", "verifyrm")  # what lab/prepare.py writes, and all an arm starts from
DEMO_PRESET = "quick"
PACKAGE = Path(__file__).resolve().parents[1]
# The code a preparation's bytes depend on (the warm start, the BCE and pair stages, the probe, the task, the
# verifier that grades, the models, the dtype choice); the lab's other modules (runs, reports, batches) do not.
SOURCE_DIRS = ("lab", "rm", "algo", "verify", "data", "models", "runtime")
NOT_PREPARATION = {"lab/batch.py", "lab/blindspot.py", "lab/progress.py", "lab/prepared.py", "lab/reading.py"}


def source_digest() -> str:
    """sha256 over the preparation's modules (SOURCE_DIRS, less NOT_PREPARATION) and cli/verifyrm.py."""
    digest = hashlib.sha256()
    files = [p for d in SOURCE_DIRS for p in sorted((PACKAGE / d).glob("*.py"))] + [PACKAGE / "cli" / "verifyrm.py"]
    for path in files:
        name = str(path.relative_to(PACKAGE))
        if name not in NOT_PREPARATION:
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def preparation_key(preset) -> dict:
    from cooper_openrlhf.lab.presets import RESUMABLE_FIELDS
    from cooper_openrlhf.runtime.dtype import fast_dtype_name

    settings = {k: v for k, v in json.loads(json.dumps(asdict(preset))).items() if k not in RESUMABLE_FIELDS}
    return {"settings": settings, "dtype": fast_dtype_name(cuda=False), "sources": source_digest()}


def store_dir(preset) -> Path:
    from cooper_openrlhf.models.paths import models_dir
    from cooper_openrlhf.runtime.dtype import fast_dtype_name

    return models_dir() / "prepared" / f"lab-{preset.name}-{fast_dtype_name(cuda=False)}"


def is_current(store: Path, preset) -> bool:
    path = store / KEY_FILE
    return path.is_file() and json.loads(path.read_text(encoding="utf-8")) == preparation_key(preset)


def has_preparation(out: Path) -> bool:
    return any((out / part).exists() for part in ("policy", "verifyrm"))


def copy_prepared(preset, out: Path) -> Path | None:
    """Copy the install's preparation of `preset` into the lab folder `out` when `out` holds none yet and the store's
    key is this lab's; returns the store copied from, else None. Weights are hard-linked (read only: no arm writes
    into the starting policy or RM); JSON records and logs are copied with the store's path rewritten to `out`'s
    (the pair stage's records name their RMs by path)."""
    store = store_dir(preset)
    if has_preparation(out) or not is_current(store, preset):
        return None
    for part in PARTS:
        for path in sorted([*(store / part).rglob("*"), *store.glob(f"{part}.log")]):
            if path.is_dir():
                continue
            dest = out / path.relative_to(store)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix in (".json", ".jsonl", ".log", ".txt", ".md"):
                dest.write_text(path.read_text(encoding="utf-8").replace(str(store), str(out)), encoding="utf-8")
            else:
                try:
                    dest.hardlink_to(path)
                except OSError:  # another file system
                    shutil.copy2(path, dest)
    logger.info("starting point prepared at install: %s copied into %s", store, out)
    return store


def prepare_store(preset) -> Path:
    """Make (or keep, when current) the install's preparation of `preset`."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    from cooper_openrlhf.lab.prepare import prepare

    store = store_dir(preset)
    if is_current(store, preset):
        print(f"[install] the demo's starting point is prepared: {store}")
        return store
    print(f"[install] preparing the demo's starting point (warm start, starting RM; once, a few minutes): {store}")
    if store.exists():  # another key's, or unfinished: prepared afresh (its paths are written into its records)
        shutil.rmtree(store)
    store.mkdir(parents=True)
    with logging_redirect_tqdm():  # the stages' progress lines stay whole between their log lines
        prepare(preset, store)
    (store / KEY_FILE).write_text(json.dumps(preparation_key(preset), indent=2) + "\n", encoding="utf-8")
    return store


def main(argv: list[str] | None = None) -> int:
    from cooper_openrlhf.lab.presets import PRESETS

    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in argv or [DEMO_PRESET]:
        prepare_store(PRESETS[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
