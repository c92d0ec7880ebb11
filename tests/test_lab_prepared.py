"""The demo's starting point made at install (lab/prepared.py): a lab folder with no preparation starts from a copy
of it when the key matches -- the preset's settings, the CPU's dtype, the preparation's code -- and from nothing
otherwise."""

import json
from dataclasses import replace

import pytest

from cooper_openrlhf.lab import prepared
from cooper_openrlhf.lab.presets import PRESETS


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An install's finished preparation of the quick preset, as lab/prepare.py lays one out."""
    monkeypatch.setenv("COOPER_MODELS_DIR", str(tmp_path / "models"))
    preset = PRESETS["quick"]
    folder = prepared.store_dir(preset)
    (folder / "policy").mkdir(parents=True)
    (folder / "policy" / "model.safetensors").write_bytes(b"weights")
    (folder / "policy" / "warm_start.json").write_text(json.dumps({"train_accuracy": 0.4}))
    (folder / "verifyrm" / "pairs" / "seed2").mkdir(parents=True)
    (folder / "verifyrm" / "pairs" / "seed2" / "model.safetensors").write_bytes(b"rm")
    (folder / "verifyrm" / "pairs" / "chosen.json").write_text(json.dumps({"seed": 2, "bce_rm": str(folder / "verifyrm" / "best")}))
    (folder / "verifyrm.log").write_text(f"trained into {folder}/verifyrm\n")
    (folder / "data").mkdir()
    (folder / "data" / "prompts.jsonl").write_text('{"input": "2 + 3"}\n')
    (folder / prepared.KEY_FILE).write_text(json.dumps(prepared.preparation_key(preset)))
    return folder


def test_a_new_lab_folder_starts_from_the_installs_preparation_with_its_paths(store, tmp_path):
    out = tmp_path / "runs" / "lab-quick"
    assert prepared.copy_prepared(PRESETS["quick"], out) == store
    weights = out / "verifyrm" / "pairs" / "seed2" / "model.safetensors"
    assert weights.read_bytes() == b"rm" and weights.stat().st_ino == (store / weights.relative_to(out)).stat().st_ino
    assert json.loads((out / "verifyrm" / "pairs" / "chosen.json").read_text())["bce_rm"] == str(out / "verifyrm" / "best")
    assert (out / "verifyrm.log").read_text() == f"trained into {out}/verifyrm\n"
    assert (out / "data" / "prompts.jsonl").is_file() and (out / "policy" / "warm_start.json").is_file()


def test_a_folder_with_a_preparation_of_its_own_keeps_it(store, tmp_path):
    out = tmp_path / "lab"
    (out / "policy").mkdir(parents=True)
    assert prepared.copy_prepared(PRESETS["quick"], out) is None
    assert not (out / "verifyrm").exists()


@pytest.mark.parametrize("change", ["settings", "dtype", "code", "unfinished"])
def test_another_key_or_an_unfinished_store_prepares_afresh(store, tmp_path, monkeypatch, change):
    preset = PRESETS["quick"]
    if change == "settings":  # e.g. --preparation-seed 1
        preset = replace(preset, preparation_seed=1)
    elif change == "dtype":  # the store of this CPU's other dtype is not this one's
        key = json.loads((store / prepared.KEY_FILE).read_text())
        (store / prepared.KEY_FILE).write_text(json.dumps({**key, "dtype": "bf16" if key["dtype"] == "fp32" else "fp32"}))
    elif change == "code":
        monkeypatch.setattr(prepared, "source_digest", lambda: "another version of the warm start")
    else:
        (store / prepared.KEY_FILE).unlink()
    assert prepared.copy_prepared(preset, tmp_path / "lab") is None
    assert not (tmp_path / "lab").exists()

