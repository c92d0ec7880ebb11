"""The one registry every choice by name is looked up in (algo/registry.py): what a user sees for a bad name."""

import argparse

import pytest

from cooper_openrlhf.algo.registry import NEGATIVE_SOURCES, Registry


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


def test_bare_names_choose_themselves_and_serve_as_argparse_choices(capsys):
    assert NEGATIVE_SOURCES["mixed"] == "mixed"
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--cooper.negative_source", choices=NEGATIVE_SOURCES, default="assistant")
    assert getattr(parser.parse_args(["--cooper.negative_source", "rollout"]), "cooper.negative_source") == "rollout"
    with pytest.raises(SystemExit):
        parser.parse_args(["--cooper.negative_source", "model"])
    assert "invalid choice: 'model' (choose from 'assistant', 'rollout', 'mixed')" in capsys.readouterr().err
