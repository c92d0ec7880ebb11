"""What a newcomer meets first: the README's commands exist and answer --help, every link and image in README and
docs/ resolves, every published result folder is cited by some page (an uncited folder is clutter), and each quick
start's commands run as written -- in DRY_RUN where they need Slurm and GPUs, on a copy where they change the
installed OpenRLHF -- with the mistakes a first hour makes caught in one `error:` line naming the fix. Quick start 1
(`make demo`, minutes of training) is followed up to the command it runs; quick start 4's requests are
tests/test_serve_*'s."""

import contextlib
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
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


@pytest.mark.parametrize("subcommand", sorted(set(COOPER.findall("\n".join(page.read_text() for page in PAGES)))))
def test_every_cooper_command_the_readme_and_docs_name_exists_and_answers_help(subcommand, monkeypatch):
    from cooper_openrlhf.cli.main import main

    monkeypatch.setattr("sys.argv", ["cooper"])
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        try:
            code = main([*subcommand.split(), "--help"])  # `cooper inspect --help` returns; a tool's argparse exits
        except SystemExit as done:
            code = done.code
    assert code == 0 and "usage:" in shown.getvalue()


def test_the_readme_and_guides_run_every_tool_as_a_cooper_subcommand():
    """One way in: where `cooper` has the subcommand, README and docs/*.md use it. `python -m` stays for a command
    run from a worktree pinned at another commit (it imports that checkout's package, `cooper` the installed one)
    and for a module no subcommand runs (the install's own steps). The notebook records what was run, as it was."""
    from cooper_openrlhf.cli.main import COMMANDS, INSPECT_TOOLS

    subcommand = {f"cooper_openrlhf.{module}": name for name, module in {**COMMANDS, **INSPECT_TOOLS}.items()}
    stray = [f"{page.relative_to(REPO)}: python -m {module} -> cooper {subcommand[module]}"
             for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
             for line in page.read_text().splitlines() if "worktree" not in line
             for module in re.findall(r"python -m (cooper_openrlhf(?:\.\w+)+)", line) if module in subcommand]
    assert not stray, "\n  ".join(["commands to write in the cooper form:", *stray])


def test_the_readmes_scripts_and_make_targets_exist():
    readme = (REPO / "README.md").read_text()
    for script in set(re.findall(r"bash (scripts/[\w./-]+|launch_scripts/[\w./-]+)", readme)):
        assert (REPO / script).is_file(), script
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    assert set(re.findall(r"\bmake (\w+)", readme)) <= targets


def _section(number: int) -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split(f"## Quick start {number}", 1)[1].split("\n## ", 1)[0]


def _quick_start_2_script() -> str:
    """The README's cluster quick start, as a script: its bash block, less the GPU smoke test (GPUs only)."""
    (block,) = re.findall(r"```bash\n(.*?)```", _section(2).split("Without Slurm", 1)[0], re.S)
    return "\n".join(line for line in block.splitlines() if "scripts/gpu_smoke.sh" not in line)


def _commands(script: str) -> list[str]:
    """A script's commands, one per entry: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def _command(script: str, containing: str) -> str:
    (line,) = [c for c in _commands(script) if containing in c]
    return line


def _env(**extra) -> dict:
    """A newcomer's shell: the venv's `python` first on PATH, the checkout's package, nothing else of this session."""
    return {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/tmp"),
            "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **extra}


def _bash(command: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=_env(**env), capture_output=True,
                          text=True, timeout=600)


def _user_folders(root: Path, problems: int) -> None:
    """What a newcomer has before quick start 2: their problems (MATH's keys, not this package's), model folders,
    the steps' outputs standing in for finished steps, and benchmark files where the README's DATA_DIR says."""
    (root / "launch_scripts").symlink_to(REPO / "launch_scripts")
    (root / "my_problems.jsonl").write_text("".join(
        json.dumps({"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1), "solution": "..."}) + "\n"
        for i in range(problems)))
    classifier = {"architectures": ["Qwen2ForSequenceClassification"], "model_type": "qwen2", "num_labels": 1}
    folders = {"models/policy": {}, "models/judge": {}, "models/rm-base": {}, "runs/verifyrm/best": classifier,
               **{f"runs/{arm}/final": {} for arm in ("cooper", "static", "rule")}}
    for folder, config in folders.items():
        (root / folder).mkdir(parents=True)
        (root / folder / "config.json").write_text(json.dumps(config))
    (data_dir,) = set(re.findall(r"\bDATA_DIR=(\S+)", _quick_start_2_script()))
    rows = {"gsm8k": {"question": "1+1?", "answer": "#### 2"}, "math500": {"problem": "1+1?", "answer": "2"},
            "svamp": {"Body": "b", "Question": "1+1?", "Answer": 2},
            "olympiadbench": {"question": "1+1?", "final_answer": ["2"]}}
    for name, row in rows.items():
        (root / data_dir / name).mkdir(parents=True, exist_ok=True)
        (root / data_dir / name / "test.jsonl").write_text(json.dumps(row) + "\n")


def test_the_readmes_cluster_quick_start_runs_in_dry_run_on_a_users_own_problems(tmp_path):
    """A newcomer's first hour: their own problems file (MATH's problem/answer keys, not this package's), model
    folders, and the README's quick start 2 run as written with DRY_RUN=1 -- only the variables the README sets, every
    launcher started the one way the README shows (`bash`, checked), each step's outputs standing in for a finished
    step. Every stage checks and prints its commands; nothing is submitted."""
    script = _quick_start_2_script()
    assert "sbatch launch_scripts" not in (REPO / "README.md").read_text(), "one way to submit: bash, checked"
    _user_folders(tmp_path, problems=100)
    env = _env(DRY_RUN="1")
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


# ------------------------------------------------------------------ quick start 1: the demo
def test_make_demo_runs_the_labs_quick_preset_into_the_folder_the_readme_names():
    """`make demo` trains for minutes (tests/test_lab_e2e.py runs the lab's own tiny preset): followed here up to
    the command it runs and the folder its report lands in."""
    made = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and "cooper_openrlhf.cli.demo" in made.stdout, made.stdout + made.stderr
    from cooper_openrlhf.cli.lab import parse_args

    out = Path(parse_args(["--preset", "quick"]).out).resolve().relative_to(Path.cwd().resolve())
    assert f"`{out}/`" in _section(1) and f"`{out}/report/`" in _section(1)


# ------------------------------------------------------------------ quick start 2: the mistakes of a first hour
def test_no_example_variable_names_a_folder_of_the_checkout():
    """A newcomer runs the quick starts in the checkout: an example value that is one of its folders (README step 4's
    `DATA_DIR=benchmarks`: the speed scripts) points a launcher at the wrong files."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.splitlines()
    folders = {path.split("/", 1)[0] for path in tracked if "/" in path}
    pages = [REPO / "README.md", REPO / "docs" / "cluster.md", *sorted((REPO / "launch_scripts").iterdir())]
    clashes = []
    for page in pages:
        text = page.read_text()
        if page.suffix == ".md":  # the code blocks a reader copies
            text = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
        for name, value in re.findall(r"\b([A-Z][A-Z0-9_]*)=([^\s\"'$;)]+)", text):
            for item in re.split(r"[,:]", value):
                if item.split("/", 1)[0] in folders and not item.startswith("/"):
                    clashes.append(f"{page.relative_to(REPO)}: {name}={value}")
    assert not clashes, "example values that are folders of the checkout:\n  " + "\n  ".join(sorted(set(clashes)))


def test_evaluate_refuses_the_checkouts_own_benchmarks_folder_in_one_error_line(tmp_path):
    _user_folders(tmp_path, problems=4)
    line = _command(_quick_start_2_script(), "evaluate.sbatch")
    result = _bash(re.sub(r"DATA_DIR=\S+", f"DATA_DIR={REPO / 'benchmarks'}", line), tmp_path, DRY_RUN="1")
    assert result.returncode == 2
    (error,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert "this checkout's own benchmarks/ folder" in error and "my_benchmarks/gsm8k/test.jsonl" in error


def test_a_small_problem_file_lowers_shards_and_rm_training_is_told_to_match_before_submitting(tmp_path):
    """Six problems: quick start 2's step 2 as written. Annotate says to lower SHARDS and to give training the same;
    the user lowers it for annotate only and runs the training line as written: one `error:` line with the value
    (its dry run used to pass, and the job's merge then asked to re-submit the annotate array, the wrong fix)."""
    _user_folders(tmp_path, problems=6)
    script = _quick_start_2_script()
    annotate, train = _command(script, "verifyrm_annotate.sbatch"), _command(script, "verifyrm_train.sbatch")

    first = _bash(annotate, tmp_path, DRY_RUN="1")
    assert first.returncode == 2
    assert "SHARDS=8: more shards than the 6 prompts" in first.stderr and "verifyrm_train.sbatch" in first.stderr
    lowered = _bash(f"SHARDS=4 {annotate}", tmp_path, DRY_RUN="1")
    assert lowered.returncode == 0, lowered.stderr

    result = _bash(train, tmp_path, DRY_RUN="1")
    assert result.returncode == 2 and "sbatch" not in result.stdout
    (error,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert "SHARDS=8" in error and "split into 4 shards" in error and "set SHARDS=4" in error
    matched = _bash(f"SHARDS=4 {train}", tmp_path, DRY_RUN="1")
    assert matched.returncode == 0, matched.stderr
    assert "4 of 4 shards have not finished yet" in matched.stderr and "after the annotate array" in matched.stderr

    # Submitted anyway with SHARDS=8 (plain sbatch skips the check): the job's merge step names the same cause.
    merge = _bash("python -m cooper_openrlhf.cli.preflight merge-annotations", tmp_path, ANNOTATED="runs/annotate",
                  OUT="runs/verifyrm", SHARDS="8")
    assert merge.returncode == 2 and "set SHARDS=4" in merge.stderr and "re-submit" not in merge.stderr


def test_reproduce_paper_takes_the_quick_starts_variable_names_and_refuses_its_old_ones(tmp_path):
    """`bash launch_scripts/reproduce_paper.sh` runs quick start 2 at once: given the variables the README's steps
    set, every stage is checked (DRY_RUN=1); a former name is refused naming the one that replaced it."""
    _user_folders(tmp_path, problems=100)
    script = _quick_start_2_script()
    assert "bash launch_scripts/reproduce_paper.sh" in _section(2)
    given = {}
    for line in _commands(script):  # every variable the steps set, as the README sets it
        given.update(re.findall(r"\b([A-Z][A-Z0-9_]*)=(\S+)", line.split(" bash ", 1)[0]))
    same = {name: given[name] for name in ("POLICY", "ASSISTANT_MODEL", "GENERATORS", "JUDGE", "PRETRAIN",
                                           "INIT_HEAD", "NODES", "DATA_DIR")}
    # PROMPTS as annotate reads it: the user's problems (the chain prepares the RL arms' prompt file from them)
    (same["PROMPTS"],) = re.findall(r"\bPROMPTS=(\S+)", _command(script, "verifyrm_annotate.sbatch"))
    # One arm: each arm's check parses train_cooper's flags with OpenRLHF's parser (seconds each on 2 cores), and the
    # three arms' are alike (tests/test_launch_scripts.py chains two).
    env = {**same, "WORKDIR": "runs/paper", "HELDOUT": "64", "ARMS": "cooper", "DRY_RUN": "1"}
    result = _bash("bash launch_scripts/reproduce_paper.sh", tmp_path, **env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all stages checked" in result.stderr and "error:" not in result.stderr

    for old, new in (("TRAIN_DATA", "PROMPTS"), ("EVAL_DATA_DIR", "DATA_DIR"), ("RM_BASE", "PRETRAIN"),
                     ("RL_NODES", "NODES"), ("TRAIN_FORMAT", "FORMAT"), ("ANNOTATE_FORMAT", "FORMAT")):
        refused = _bash("bash launch_scripts/reproduce_paper.sh", tmp_path, **env, **{old: "x"})
        assert refused.returncode == 2 and not (tmp_path / "runs" / "paper" / "annotate" / "x").exists()
        (error,) = [line for line in refused.stderr.splitlines() if "error:" in line]
        assert f"{old} is set" in error and f"set {new} instead" in error


# ------------------------------------------------------------------ quick start 2's report, and the service's
def _report(run_dirs: list[Path], out: Path, capsys) -> str:
    from cooper_openrlhf.cli.main import main

    assert main(["report", *map(str, run_dirs), "--out", str(out)]) == 0
    return capsys.readouterr().out


def _about_the_lab(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if re.search(r"\bbatch(es)?\b|committed|pre-registered|the lab\b",
                                                                  line, re.I)]


def test_cooper_report_on_a_users_own_trainer_run_prints_that_run_only(tmp_path, capsys, monkeypatch):
    """`cooper report RUN_DIR --out report` on one `cooper train` run of one's own: the lines are about it."""
    from run_folders import write_events

    run = tmp_path / "runs" / "my-grpo"
    steps = range(1, 21)
    write_events(run / "tensorboard" / "my-grpo", {
        "train/cooper/rm_reward_mean": [(s, 0.5 + 0.01 * s) for s in steps],
        "train/cooper/verified_accuracy": [(s, 0.35) for s in steps],
        "train/cooper/hacking_alarm": [(s, float(s >= 18)) for s in steps],
        "eval/accuracy": [(s, 0.11) for s in (10, 20)]})
    monkeypatch.chdir(tmp_path)
    printed = _report([run], tmp_path / "report", capsys)
    assert not _about_the_lab(printed), _about_the_lab(printed)
    assert "my-grpo (1 run, 20 logged steps" in printed
    assert "RM reward 0.53 -> 0.68, verified accuracy 0.35 -> 0.35" in printed
    assert "held-out accuracy, first -> last of 2 evaluations: 0.11 -> 0.11" in printed
    assert "hacking alarm: on at 3 steps, first at step 18" in printed
    assert "Held-out against training accuracy" in printed  # where the two levels are explained


def test_cooper_report_on_a_reward_services_logs_prints_the_services_steps_only(tmp_path, capsys):
    """docs/serve.md: `cooper report STATE_DIR/logs --out report` reads the service's steps as a training run's."""
    from cooper_openrlhf.serve.metrics import ServiceLog

    log = ServiceLog(str(tmp_path / "rm-service" / "logs"))
    for step in range(1, 9):
        log.step(step, {"cooper/rm_reward_mean": 0.6, "cooper/verified_accuracy": 0.4, "cooper/rm_loss": 0.5,
                        "cooper/rm_pair_accuracy": 0.75, "cooper/hacking_alarm": 0.0})
    log.close()
    printed = _report([tmp_path / "rm-service" / "logs"], tmp_path / "report", capsys)
    assert not _about_the_lab(printed), _about_the_lab(printed)
    assert "reward-service (1 run, 8 logged steps" in printed and "hacking alarm: never on" in printed
    assert "RM pair accuracy on each step's fresh pairs, before its update, first -> last 4 steps: 0.75 -> 0.75" in printed


# ------------------------------------------------------------------ quick start 3: the patch
def test_the_patch_lines_apply_and_undo_as_written_on_a_copy_of_the_installed_openrlhf(tmp_path):
    """The README's `patch` line as written, its `python -c` finding a copy of the installed OpenRLHF (first on
    PYTHONPATH), then the same line with -R: the copy is patched, then byte-identical to the original again."""
    import openrlhf

    installed = Path(openrlhf.__file__).parent
    site = tmp_path / "site"
    shutil.copytree(installed, site / "openrlhf", ignore=shutil.ignore_patterns("__pycache__"))
    (line,) = [c for c in _commands("\n".join(re.findall(r"```bash\n(.*?)```", _section(3), re.S)))
               if c.startswith("patch -p1")]
    target = site / "openrlhf" / "cli" / "train_ppo_ray.py"
    env = {"PYTHONPATH": f"{site}:{REPO}"}
    applied = subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=REPO, env=_env(**env), capture_output=True,
                             text=True, timeout=120)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "remote_rm_trainable" in target.read_text()
    assert (installed / "cli" / "train_ppo_ray.py").read_text() != target.read_text()  # the copy, not the venv
    undone = subprocess.run(["bash", "-euo", "pipefail", "-c", line.replace("patch -p1", "patch -R -p1", 1)], cwd=REPO,
                            env=_env(**env), capture_output=True, text=True, timeout=120)
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert target.read_bytes() == (installed / "cli" / "train_ppo_ray.py").read_bytes()


# ------------------------------------------------------------------ quick start 4: the service's start-up lines
def test_the_token_line_and_every_flag_of_the_serve_line_as_written(tmp_path):
    """The token line run as written (a private file of one token); every flag of the `cooper serve` line is one
    `cooper serve --help` lists. The requests themselves are tests/test_serve_*'s."""
    block = "\n".join(re.findall(r"```bash\n(.*?)```", _section(4), re.S))
    token_line = _command(block, "secrets.token_urlsafe")
    made = _bash(token_line, tmp_path)
    assert made.returncode == 0, made.stderr
    token = (tmp_path / "token.txt").read_text().strip()
    assert len(token) >= 32 and (tmp_path / "token.txt").stat().st_mode & 0o777 == 0o600
    serve = _command(block, "cooper serve")
    shown = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.main", "serve", "--help"], cwd=REPO, env=_env(),
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    missing = [flag for flag in re.findall(r"(--[a-z][\w-]*)", serve) if flag not in shown.stdout]
    assert not missing, missing
