"""The `cooper` command: one entry point whose help lists every tool, each tool's help opening with what it does."""

import ast
import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from cooper_openrlhf.cli.main import COMMANDS, INSPECT_TOOLS, main, summary

REPO = Path(__file__).resolve().parent.parent
EVERY_SUBCOMMAND = [[name] for name in COMMANDS] + [["inspect", name] for name in INSPECT_TOOLS]


def _flat(text: str) -> str:
    return " ".join(text.split())  # argparse re-wraps descriptions to the terminal's width


def test_setup_installs_the_cooper_console_script():
    setup = ast.parse((REPO / "setup.py").read_text())
    entry_points = next(kw.value for node in ast.walk(setup) if isinstance(node, ast.Call)
                        for kw in node.keywords if kw.arg == "entry_points")
    scripts = ast.literal_eval(entry_points)["console_scripts"]
    assert "cooper=cooper_openrlhf.cli.main:main" in scripts


def test_cooper_help_lists_every_subcommand_with_its_one_line_description_without_importing_them():
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "cooper_openrlhf.cli.main", "--help"],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    for name, module in {**COMMANDS, **INSPECT_TOOLS}.items():
        line = summary(module)
        assert 0 < len(line) <= 120 and line[-1] in ".?", (module, line)  # one line saying what it does
        assert (f"  {name} " in result.stdout and line in result.stdout) or name in INSPECT_TOOLS, name
    assert "inspect" in result.stdout and all(name in result.stdout for name in INSPECT_TOOLS)
    assert " torch" not in result.stderr and " ray" not in result.stderr  # the listing is instant

    inspect = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.main", "inspect", "--help"],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
    assert inspect.returncode == 0
    assert all(summary(module) in inspect.stdout for module in INSPECT_TOOLS.values())


@pytest.mark.parametrize("subcommand", EVERY_SUBCOMMAND, ids=" ".join)
def test_each_subcommand_help_exits_0_opening_with_what_it_does(subcommand, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # stock-openrlhf runs OpenRLHF's module as __main__
    shown = io.StringIO()
    with pytest.raises(SystemExit) as done, contextlib.redirect_stdout(shown):
        main([*subcommand, "--help"])
    assert done.value.code == 0
    text = _flat(shown.getvalue())
    module = {**COMMANDS, **INSPECT_TOOLS}[subcommand[-1]]
    description = _flat(summary(module))
    assert description in text
    assert text.index(description) < text.index("-h, --help"), "the description comes before the flags"


def test_an_unknown_subcommand_names_the_valid_ones(capsys):
    assert main(["trian"]) == 2
    assert "unknown subcommand 'trian'; valid: train, serve" in capsys.readouterr().err
    assert main(["inspect", "nope"]) == 2
    assert "valid: blindspot, probe-rm" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["batch", "stock-openrlhf", "serve-parity"])
def test_inspect_holds_only_read_only_tools_and_refuses_a_command_that_runs_things_naming_its_place(name, capsys):
    assert name in COMMANDS and name not in INSPECT_TOOLS
    assert main(["inspect", name, "docs/lab/batch46/plan.json"]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith("cooper inspect: error:") and f"`cooper {name} ...`" in error


def test_the_module_form_still_runs():
    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.report", "--help"], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0 and result.stdout.startswith("usage: cooper report")
