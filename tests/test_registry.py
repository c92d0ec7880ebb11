"""The one registry every choice by name is looked up in (runtime/registry.py): what a user sees for a bad name."""

import argparse

import pytest

from cooper_openrlhf.algo.registry import NEGATIVE_SOURCES, NEGATIVE_VALIDITIES
from cooper_openrlhf.runtime.registry import Registry


def test_a_registered_name_is_found_and_an_unknown_one_fails_listing_the_valid_names_in_order():
    forms = Registry("reward form")

    @forms.register("continuous")
    def continuous(x):
        return x

    forms.add("discrete", round)
    assert forms["continuous"] is continuous and forms["discrete"] is round
    assert list(forms) == ["continuous", "discrete"] and len(forms) == 2 and "discrete" in forms
    with pytest.raises(ValueError, match=r"^unknown reward form 'binary'; valid: \['continuous', 'discrete'\]$"):
        forms["binary"]
    assert forms.check("discrete") == "discrete"
    with pytest.raises(ValueError, match="'continuous' is registered twice"):
        forms.add("continuous", abs)


def test_bare_names_choose_themselves_and_a_registry_serves_as_argparse_choices(capsys):
    assert NEGATIVE_VALIDITIES["official"] == "official"
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--cooper.negative_source", choices=NEGATIVE_SOURCES, default="assistant")
    assert getattr(parser.parse_args(["--cooper.negative_source", "rollout"]), "cooper.negative_source") == "rollout"
    with pytest.raises(SystemExit):
        parser.parse_args(["--cooper.negative_source", "model"])
    assert "invalid choice: 'model' (choose from 'assistant', 'mixed', 'rollout')" in capsys.readouterr().err


def test_the_dtype_model_and_benchmark_lookups_fail_with_the_registrys_sentence(tmp_path):
    """The layers below algo look their names up in the same registry (runtime/registry.py): an unknown dtype,
    model or benchmark fails with one sentence listing the valid names (the dtype's as the DtypeError its callers
    catch), no longer a KeyError for some of them."""
    from cooper_openrlhf.data.benchmarks import load_benchmark
    from cooper_openrlhf.models import model_path
    from cooper_openrlhf.models.materialize import materialize
    from cooper_openrlhf.runtime.dtype import DtypeError, resolve_dtype_name

    with pytest.raises(DtypeError, match=r"^unknown dtype 'fp8'; valid: \['auto', 'bf16', 'fp16', 'fp32'\]$"):
        resolve_dtype_name("fp8")
    models = r"\['smollm2-135m-instruct', 'minilm-l6-v2', 'tiny-qwen2-policy', 'tiny-qwen2-rm'\]$"
    with pytest.raises(ValueError, match=r"^unknown model 'gpt-5'; valid: " + models):
        model_path("gpt-5")
    with pytest.raises(ValueError, match=r"^unknown model 'gpt-5'; valid: " + models):
        materialize("gpt-5", tmp_path)
    with pytest.raises(ValueError, match=r"^unknown benchmark 'aime'; valid: \['gsm8k', "):
        load_benchmark("aime", tmp_path / "aime.jsonl")
    assert not any(tmp_path.iterdir())  # nothing written for a name it does not know
    from cooper_openrlhf.lab.task import TaskSpec

    with pytest.raises(ValueError, match=r"^unknown task family 'algebra'; valid: \['digits', 'words'\]$"):
        TaskSpec(family="algebra")
