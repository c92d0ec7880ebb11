"""What a newcomer meets first: the README's commands exist and answer --help, every link and image in README and
docs/ resolves, and every published result folder is cited by some page (an uncited folder is clutter)."""

import contextlib
import importlib
import io
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "lab").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CLI = re.compile(r"python -m (cooper_openrlhf\.cli\.\w+)")
COOPER = re.compile(r"(?:^|`)cooper (inspect [a-z][\w-]*|[a-z][\w-]*)", re.M)  # at a line's start or in code


def test_every_link_and_image_in_readme_and_docs_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            if not (page.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, "links to nothing:\n  " + "\n  ".join(broken)


def test_every_published_result_folder_is_cited():
    text = "\n".join(page.read_text() for page in PAGES)
    folders = sorted(p.name for p in (REPO / "docs" / "results").iterdir() if p.is_dir())
    uncited = [name for name in folders if f"results/{name}" not in text]
    assert not uncited, f"docs/results folders no page cites (remove them; git history keeps them): {uncited}"


@pytest.mark.parametrize("module", sorted(set(CLI.findall("\n".join(page.read_text() for page in PAGES)))))
def test_every_python_m_command_the_docs_name_exists_and_answers_help(module):
    main = importlib.import_module(module).main
    shown = io.StringIO()
    with pytest.raises(SystemExit) as done, contextlib.redirect_stdout(shown):
        main(["--help"])
    assert done.value.code == 0 and "usage:" in shown.getvalue()


@pytest.mark.parametrize("subcommand", sorted(set(COOPER.findall((REPO / "README.md").read_text()))))
def test_every_cooper_command_the_readme_names_exists_and_answers_help(subcommand, monkeypatch):
    from cooper_openrlhf.cli.main import main

    monkeypatch.setattr("sys.argv", ["cooper"])
    shown = io.StringIO()
    with pytest.raises(SystemExit) as done, contextlib.redirect_stdout(shown):
        main([*subcommand.split(), "--help"])
    assert done.value.code == 0 and "usage:" in shown.getvalue()


def test_the_readmes_scripts_and_make_targets_exist():
    readme = (REPO / "README.md").read_text()
    for script in set(re.findall(r"bash (scripts/[\w./-]+|launch_scripts/[\w./-]+)", readme)):
        assert (REPO / script).is_file(), script
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    assert set(re.findall(r"\bmake (\w+)", readme)) <= targets


def _quick_start_2_script() -> str:
    """The README's cluster quick start, as a script: its bash block, less the GPU smoke test (GPUs only)."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quick start 2", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section.split("Without Slurm", 1)[0], re.S)
    return "\n".join(line for line in block.splitlines() if "scripts/gpu_smoke.sh" not in line)


def test_the_readmes_cluster_quick_start_runs_in_dry_run_on_a_users_own_problems(tmp_path):
    """A newcomer's first hour: their own problems file (MATH's problem/answer keys, not this package's), model
    folders, and the README's quick start 2 run as written with DRY_RUN=1 -- only the variables the README sets, every
    launcher started the one way the README shows (`bash`, checked), each step's outputs standing in for a finished
    step. Every stage checks and prints its commands; nothing is submitted."""
    import json
    import os
    import subprocess
    import sys

    script = _quick_start_2_script()
    assert "sbatch launch_scripts" not in (REPO / "README.md").read_text(), "one way to submit: bash, checked"
    (tmp_path / "launch_scripts").symlink_to(REPO / "launch_scripts")
    (tmp_path / "my_problems.jsonl").write_text("".join(
        json.dumps({"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1), "solution": "..."}) + "\n"
        for i in range(100)))
    classifier = {"architectures": ["Qwen2ForSequenceClassification"], "model_type": "qwen2", "num_labels": 1}
    folders = {"models/policy": {}, "models/judge": {}, "models/rm-base": {}, "runs/verifyrm/best": classifier,
               **{f"runs/{arm}/final": {} for arm in ("cooper", "static", "rule")}}  # what the steps before leave
    for folder, config in folders.items():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "config.json").write_text(json.dumps(config))
    rows = {"gsm8k": {"question": "1+1?", "answer": "#### 2"}, "math500": {"problem": "1+1?", "answer": "2"},
            "svamp": {"Body": "b", "Question": "1+1?", "Answer": 2},
            "olympiadbench": {"question": "1+1?", "final_answer": ["2"]}}
    for name, row in rows.items():
        (tmp_path / "benchmarks" / name).mkdir(parents=True)
        (tmp_path / "benchmarks" / name / "test.jsonl").write_text(json.dumps(row) + "\n")

    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONPATH": str(REPO), "DRY_RUN": "1"}  # the checkout's package, `python` the venv's
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "wrote 36 prompts" in out and "wrote 64 held-out prompts" in out
    assert out.count("cooper_openrlhf.cli.verifyrm annotate") == 8  # one task per shard
    assert "cooper_openrlhf.cli.verifyrm train" in out
    submits = [line for line in out.splitlines() if "ray job submit" in line]
    assert len(submits) == 3 and sum("--remote_rm_trainable" in line for line in submits) == 1  # cooper, static, rule
    assert out.count("cooper_openrlhf.cli.evaluate") == 4 and "cooper_openrlhf.cli.report" in out
    assert "error:" not in result.stderr
