"""lab/batch.py: a plan runs only from its commit's package; shared preparation; run archives round-trip."""

import json
import subprocess
from pathlib import Path

import pytest

from cooper_openrlhf.lab.batch import (PlanError, archive_run, check_commit, load_plan, restore_missing_runs,
                                       share_preparation)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@t")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "cooper_openrlhf").mkdir()
    (tmp_path / "cooper_openrlhf" / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "code")
    return tmp_path


def test_a_lab_records_the_commit_its_package_ran_from_and_says_when_it_was_edited(repo):
    from cooper_openrlhf.lab.batch import package_commit

    assert package_commit(repo) == _git(repo, "rev-parse", "HEAD")
    (repo / "notes.md").write_text("untracked\n")  # not the package: still the commit
    assert package_commit(repo) == _git(repo, "rev-parse", "HEAD")
    (repo / "cooper_openrlhf" / "a.py").write_text("x = 2\n")
    assert package_commit(repo) == _git(repo, "rev-parse", "HEAD") + "+uncommitted"
    assert package_commit(repo / "cooper_openrlhf") is None  # not a checkout's root (an installed package)
    assert package_commit(repo.parent / "no-such-folder") is None


def test_a_plan_runs_only_from_its_commits_package(repo):
    code = _git(repo, "rev-parse", "HEAD")
    check_commit(repo, code)
    (repo / "docs.md").write_text("the plan\n")  # a later commit that changes docs only: the same package
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "plan")
    check_commit(repo, code)
    (repo / "cooper_openrlhf" / "a.py").write_text("x = 2\n")
    with pytest.raises(PlanError, match="uncommitted changes under cooper_openrlhf/"):
        check_commit(repo, code)
    _git(repo, "commit", "-qam", "other code")
    with pytest.raises(PlanError, match=f"frozen at {code}.*other code") as refused:
        check_commit(repo, code)
    assert refused.value.code.startswith("batch plan refused")
    with pytest.raises(PlanError, match="failed"):
        check_commit(repo, "0" * 40)


def test_a_malformed_plan_is_refused(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"commit": "abc", "out": "x", "labs": [{"name": "a", "seeds": 1, "args": ["--seeds", "2"]}]}))
    with pytest.raises(PlanError, match="--out and --seeds come from the plan"):
        load_plan(plan)
    plan.write_text(json.dumps({"commit": "abc", "out": "x", "labs": [{"name": "a", "seeds": 1, "args": [],
                                                                      "prepared_from": "b"}]}))
    with pytest.raises(PlanError, match="not an earlier lab"):
        load_plan(plan)
    plan.write_text(json.dumps({"out": "x", "labs": []}))
    with pytest.raises(PlanError, match="lacks"):
        load_plan(plan)


def test_a_plans_environment_is_set_for_its_labs_and_a_shell_that_set_it_otherwise_is_refused(tmp_path):
    from cooper_openrlhf.lab.batch import apply_environment

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"commit": "abc", "out": "x", "labs": [], "environment": {"COOPER_CPU_BF16": 0}}))
    with pytest.raises(PlanError, match="environment must map variable names to strings"):
        load_plan(plan)
    plan.write_text(json.dumps({"commit": "abc", "out": "x", "labs": [], "environment": {"COOPER_CPU_BF16": "0"}}))
    environ = {"PATH": "/bin"}
    assert apply_environment(load_plan(plan), environ) == {"COOPER_CPU_BF16": "0"}
    assert environ == {"PATH": "/bin", "COOPER_CPU_BF16": "0"}
    apply_environment(load_plan(plan), environ)  # already as the plan says: fine
    with pytest.raises(PlanError, match="the shell has {'COOPER_CPU_BF16': '1'}"):
        apply_environment(load_plan(plan), {"COOPER_CPU_BF16": "1"})


def test_a_shared_preparation_links_models_rewrites_records_and_leaves_the_choice(tmp_path):
    source, target = tmp_path / "main", tmp_path / "median"
    (source / "verifyrm" / "pairs" / "seed0").mkdir(parents=True)
    (source / "verifyrm" / "pairs" / "seed0" / "model.safetensors").write_bytes(b"weights")
    (source / "verifyrm" / "pairs" / "seed0.json").write_text(json.dumps({"probe": {"rm": str(source / "verifyrm")}}))
    (source / "verifyrm" / "pairs" / "chosen.json").write_text("{}")
    (source / "verifyrm" / "offline_continuation").mkdir()
    (source / "verifyrm" / "offline_continuation" / "model.safetensors").write_bytes(b"later")
    for part in ("data", "policy"):
        (source / part).mkdir()
        (source / part / "f.txt").write_text(part)
    share_preparation(source, target)
    model = target / "verifyrm" / "pairs" / "seed0" / "model.safetensors"
    assert model.read_bytes() == b"weights" and model.stat().st_ino == (source / model.relative_to(target)).stat().st_ino
    assert json.loads((target / "verifyrm" / "pairs" / "seed0.json").read_text())["probe"]["rm"] == str(target / "verifyrm")
    assert not (target / "verifyrm" / "pairs" / "chosen.json").exists()
    assert not (target / "verifyrm" / "offline_continuation").exists()
    assert (target / "policy" / "f.txt").read_text() == "policy"


def test_a_run_archive_restores_what_the_report_reads_and_no_checkpoint(tmp_path):
    run = tmp_path / "lab" / "runs" / "static_seed0"
    for part in ("tensorboard", "samples", "ckpt"):
        (run / part).mkdir(parents=True)
        (run / part / "f").write_text(part)
    (run / "run_info.json").write_text(json.dumps({"status": "done"}))
    archive_run(run, tmp_path / "pub" / "static_seed0.tar.gz")
    assert restore_missing_runs(tmp_path / "pub", tmp_path / "new") == ["static_seed0"]
    restored = tmp_path / "new" / "runs" / "static_seed0"
    assert json.loads((restored / "run_info.json").read_text())["status"] == "done"
    assert (restored / "tensorboard" / "f").is_file() and not (restored / "ckpt").exists()


@pytest.mark.parametrize("batch", ["batch33", "batch33b"])
def test_published_run_archives_are_committed_under_this_repositorys_gitignore(repo, tmp_path, batch):
    """The repository ignores runs/ (lab folders); a batch's archives live in docs/results/<batch>/<lab>/runs/ and
    must be committed all the same, and nothing else of the worktree with them."""
    from cooper_openrlhf.lab.batch import commit_published, publish_runs

    (repo / ".gitignore").write_text((Path(__file__).resolve().parent.parent / ".gitignore").read_text())
    (repo / "unrelated.txt").write_text("staged elsewhere")
    _git(repo, "add", ".gitignore", "unrelated.txt")
    run = tmp_path / "lab" / "runs" / "rule_seed0"
    (run / "tensorboard").mkdir(parents=True)
    (run / "run_info.json").write_text(json.dumps({"status": "done"}))
    written = publish_runs(tmp_path / "lab", repo / "docs" / "results" / batch / "main")
    assert [p.name for p in written] == ["rule_seed0.tar.gz"]
    assert commit_published(repo, written, "batch33: main after seed 0")
    assert _git(repo, "show", "--name-only", "--format=", "HEAD") == f"docs/results/{batch}/main/runs/rule_seed0.tar.gz"
    assert "unrelated.txt" in _git(repo, "diff", "--cached", "--name-only")  # still staged, not committed
    assert publish_runs(tmp_path / "lab", repo / "docs" / "results" / batch / "main") == []  # once only


def test_a_failed_run_retried_to_done_replaces_its_published_archive(tmp_path):
    """The lab retries a failed run afresh; its archive must follow, or a resume on a new machine restores the
    failure and the verdict misses a seed."""
    from cooper_openrlhf.lab.batch import archived_status, publish_runs

    run, dest = tmp_path / "lab" / "runs" / "cooper_seed1", tmp_path / "pub"
    run.mkdir(parents=True)
    (run / "run_info.json").write_text(json.dumps({"status": "failed"}))
    assert [p.name for p in publish_runs(tmp_path / "lab", dest)] == ["cooper_seed1.tar.gz"]
    (run / "run_info.json").write_text(json.dumps({"status": "running"}))  # the retry, in flight
    assert publish_runs(tmp_path / "lab", dest) == []
    (run / "run_info.json").write_text(json.dumps({"status": "done"}))
    assert [p.name for p in publish_runs(tmp_path / "lab", dest)] == ["cooper_seed1.tar.gz"]
    assert archived_status(dest / "runs" / "cooper_seed1.tar.gz") == "done"
    assert publish_runs(tmp_path / "lab", dest) == []


def test_a_run_published_by_a_batch_stopped_before_its_commit_is_committed_by_the_resume(repo, tmp_path):
    """A batch stopped between archiving a seed's runs and committing them: the resume archives nothing new (a run is
    archived once), so it commits everything published and not yet committed."""
    from cooper_openrlhf.lab.batch import commit_published, run_batch, uncommitted

    (repo / ".gitignore").write_text((Path(__file__).resolve().parent.parent / ".gitignore").read_text())
    _git(repo, "add", ".gitignore")
    _git(repo, "commit", "-qm", "ignore")
    out, dest = tmp_path / "labs", repo / "docs" / "results" / "batch45"

    def run_lab(argv):  # the lab's entry point at the boundary: each seed's run folder, finished
        seeds, folder = int(argv[argv.index("--seeds") + 1]), Path(argv[argv.index("--out") + 1])
        for seed in range(seeds):
            (folder / "runs" / f"rule_seed{seed}" / "tensorboard").mkdir(parents=True, exist_ok=True)
            (folder / "runs" / f"rule_seed{seed}" / "run_info.json").write_text(json.dumps({"status": "done"}))
        return 0

    plan = {"commit": _git(repo, "rev-parse", "HEAD"), "out": str(out), "issue": 54, "batch": 45,
            "labs": [{"name": "main", "seeds": 2, "args": ["--preset", "style"]}]}
    assert run_batch(plan, repo, run_lab, publish=dest) == 0  # published, stopped before any commit
    assert [p.name for p in uncommitted(repo, dest / "main") if p.suffix == ".gz"] == ["rule_seed0.tar.gz",
                                                                                       "rule_seed1.tar.gz"]
    assert run_batch(plan, repo, run_lab, publish=dest, commit_to=repo) == 0
    assert _git(repo, "log", "--format=%s", "-1") == "batch45: main after seed 0 (2 runs)"
    committed = _git(repo, "log", "--name-only", "--format=", "-2").split()
    assert "docs/results/batch45/main/runs/rule_seed0.tar.gz" in committed
    assert "docs/results/batch45/main/runs/rule_seed1.tar.gz" in committed
    assert uncommitted(repo, dest / "main") == []
    # A published file changed after its commit (a retried run's archive, a rewritten report: porcelain's "XY" then
    # starts with a space) is offered too, beside a new one.
    archive = dest / "main" / "runs" / "rule_seed0.tar.gz"
    archive.write_bytes(archive.read_bytes() + b"replaced")
    (dest / "main" / "new file.md").write_text("a new one\n")
    assert uncommitted(repo, dest / "main") == [dest / "main" / "new file.md", archive]
    assert commit_published(repo, uncommitted(repo, dest / "main"), "batch45: main rewritten")
    assert uncommitted(repo, dest / "main") == []


def test_a_batch_on_a_new_machine_restores_its_published_runs_and_redoes_only_the_rest(repo, tmp_path):
    """The published archives are the batch's record: a new machine (an empty run folder) gets its finished runs back
    before the lab runs, so the lab skips them; a run this machine holds is not overwritten by its archive."""
    from cooper_openrlhf.lab.batch import run_batch, unfinished_labs

    (repo / ".gitignore").write_text((Path(__file__).resolve().parent.parent / ".gitignore").read_text())
    _git(repo, "add", ".gitignore")
    _git(repo, "commit", "-qm", "ignore")
    dest, ran = repo / "docs" / "results" / "batch46", []

    def run_lab(argv):  # the lab at the boundary: it skips a run left "done", as lab/runner.py does
        seeds, folder = int(argv[argv.index("--seeds") + 1]), Path(argv[argv.index("--out") + 1])
        for seed in range(seeds):
            for arm in ("rule", "static"):
                run = folder / "runs" / f"{arm}_seed{seed}"
                if run.joinpath("run_info.json").is_file() and \
                        json.loads(run.joinpath("run_info.json").read_text())["status"] == "done":
                    continue
                ran.append((folder.name, run.name))
                (run / "tensorboard").mkdir(parents=True, exist_ok=True)
                (run / "run_info.json").write_text(json.dumps({"status": "done", "machine": str(folder.parent)}))
        return 0

    plan = {"commit": _git(repo, "rev-parse", "HEAD"), "issue": 46,
            "labs": [{"name": "prep0", "seeds": 2, "args": ["--preset", "style", "--arms", "rule,static"]},
                     {"name": "prep1", "seeds": 1, "args": ["--preset", "style", "--arms", "rule,static"]}]}
    old = {**plan, "out": str(tmp_path / "old-machine")}
    assert run_batch({**old, "labs": old["labs"][:1]}, repo, run_lab, publish=dest) == 0
    assert unfinished_labs(plan, dest) == ["prep1"]
    assert len(ran) == 4

    ran.clear()
    (dest / "prep0" / "lab.json").write_text('{"command": "the invocation that ran them"}')
    new = tmp_path / "new-machine"
    kept = new / "prep1" / "runs" / "rule_seed0"  # finished on this machine, unpublished: its own record stays
    kept.mkdir(parents=True)
    kept.joinpath("run_info.json").write_text(json.dumps({"status": "done", "machine": "here"}))
    assert run_batch({**plan, "out": str(new)}, repo, run_lab, publish=dest) == 0
    assert ran == [("prep1", "static_seed0")]
    restored = json.loads((new / "prep0" / "runs" / "static_seed1" / "run_info.json").read_text())
    assert restored == {"status": "done", "machine": str(tmp_path / "old-machine")}
    assert json.loads(kept.joinpath("run_info.json").read_text())["machine"] == "here"
    assert json.loads((new / "prep0" / "lab.json").read_text()) == {"command": "the invocation that ran them"}
    assert unfinished_labs(plan, dest) == []


def test_a_labs_arms_are_its_arms_flag_else_its_presets():
    from cooper_openrlhf.lab.batch import lab_arms
    from cooper_openrlhf.lab.presets import PRESETS

    assert lab_arms(["--preset", "style", "--arms", "rule,oracle"]) == ("rule", "oracle")
    assert lab_arms(["--preset", "style"]) == PRESETS["style"].arms
    assert lab_arms([]) == PRESETS["quick"].arms


def test_a_preparation_fingerprint_tells_a_resumed_preparation_from_another(tmp_path):
    """A batch resumed on a new machine redoes its preparation: the published fingerprint says whether the arms there
    start from the same bytes as the runs already published."""
    from cooper_openrlhf.lab.batch import compare_fingerprints, one_sided, preparation_fingerprint

    lab = tmp_path / "main"
    for name, data in (("data/train.jsonl", b"rows"), ("policy/model.safetensors", b"policy"),
                       ("verifyrm/model.safetensors", b"bce"), ("verifyrm/pairs/seed0/model.safetensors", b"pair"),
                       ("verifyrm/train_summary.json", b"{}")):
        (lab / name).parent.mkdir(parents=True, exist_ok=True)
        (lab / name).write_bytes(data)
    published = preparation_fingerprint(lab)
    assert sorted(published["files"]) == ["data/train.jsonl", "policy/model.safetensors",
                                          "verifyrm/model.safetensors", "verifyrm/pairs/seed0/model.safetensors"]
    assert "family" in published["machine"] and "auto dtype" in published["machine"]
    assert compare_fingerprints(published, preparation_fingerprint(lab)) == []
    (lab / "verifyrm" / "pairs" / "seed0" / "model.safetensors").write_bytes(b"other bytes")
    (lab / "verifyrm" / "pairs" / "seed1").mkdir()
    (lab / "verifyrm" / "pairs" / "seed1" / "model.safetensors").write_bytes(b"pair 1")
    assert compare_fingerprints(published, preparation_fingerprint(lab)) == [
        "verifyrm/pairs/seed0/model.safetensors: different"]
    assert one_sided(published, preparation_fingerprint(lab)) == (0, 1)  # a file only one side has is no difference
    (lab / "verifyrm" / "pairs" / "seed0" / "model.safetensors").write_bytes(b"pair")
    assert compare_fingerprints(published, preparation_fingerprint(lab)) == []
    with pytest.raises(FileNotFoundError, match="nothing to fingerprint"):
        preparation_fingerprint(tmp_path / "empty")


def test_the_batch_cli_writes_a_fingerprint_then_compares_with_it(tmp_path, capsys):
    from cooper_openrlhf.cli.batch import main

    lab = tmp_path / "runs" / "main"
    (lab / "policy").mkdir(parents=True)
    (lab / "policy" / "model.safetensors").write_bytes(b"policy")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"commit": "abc", "out": str(tmp_path / "runs"),
                                "labs": [{"name": "main", "seeds": 1, "args": []},
                                         {"name": "median", "seeds": 1, "args": [], "prepared_from": "main"}]}))
    published = tmp_path / "pub"
    assert main([str(plan), "--fingerprint", str(published)]) == 0
    assert "1 files hashed" in capsys.readouterr().out and (published / "main" / "preparation.json").is_file()
    assert main([str(plan), "--fingerprint", str(published)]) == 0
    assert "the same preparation" in capsys.readouterr().out
    (lab / "policy" / "model.safetensors").write_bytes(b"another policy")
    assert main([str(plan), "--fingerprint", str(published)]) == 1
    out = capsys.readouterr().out
    assert "policy/model.safetensors: different" in out and "median: not prepared yet" in out
    # --commit-to alone would be ignored (it commits what --publish archives): refused before anything runs
    with pytest.raises(SystemExit):
        main([str(plan), "--commit-to", str(tmp_path)])
    assert "--commit-to commits what --publish archives; give --publish too" in capsys.readouterr().err


def test_a_batchs_lab_folder_refuses_a_hand_started_lab_from_another_commit(repo, tmp_path):
    from cooper_openrlhf.cli import lab as lab_cli
    from cooper_openrlhf.lab.batch import PLAN_MARKER, check_folder_commit, plan_of_folder

    code = _git(repo, "rev-parse", "HEAD")
    folder = tmp_path / "runs" / "main"
    plans = repo / "docs" / "lab" / "batchX"
    plans.mkdir(parents=True)
    (plans / "plan.json").write_text(json.dumps({"commit": code, "out": str(tmp_path / "runs"),
                                                 "labs": [{"name": "main", "seeds": 1, "args": []}]}))
    assert plan_of_folder(repo, folder)["commit"] == code  # a folder of a plan under docs/, no marker needed
    assert plan_of_folder(repo, tmp_path / "elsewhere") is None
    check_folder_commit(repo, folder)  # the plan's commit: runs
    (repo / "cooper_openrlhf" / "a.py").write_text("x = 2\n")
    _git(repo, "commit", "-qam", "other code")
    with pytest.raises(PlanError, match=r"lab 'main' of the plan .*plan.json \(the plan is frozen at"):
        check_folder_commit(repo, folder)

    # The real entry point, from this checkout: a folder marked by a batch at another commit is refused before
    # anything is written into it.
    marked = tmp_path / "marked"
    marked.mkdir()
    frozen = json.loads((Path(__file__).resolve().parents[1] / "docs/lab/batch33b/plan.json").read_text())["commit"]
    (marked / PLAN_MARKER).write_text(json.dumps({"commit": frozen, "lab": "main"}))
    with pytest.raises(SystemExit, match=f"batch plan refused: .*frozen at {frozen}"):
        lab_cli.main(["--preset", "tiny", "--out", str(marked)])
    assert sorted(p.name for p in marked.iterdir()) == [PLAN_MARKER]
    # An installed package (no checkout): the marked folder is refused, saying why; an unmarked one runs.
    with pytest.raises(PlanError, match=r"lab 'main' of the plan .*runs from no git checkout"):
        check_folder_commit(None, marked)
    check_folder_commit(None, tmp_path / "elsewhere")


def test_the_labs_commands_find_the_checkout_the_package_runs_from():
    """The plans and the committed verdicts are read from the checkout `package_checkout` names, never from a path
    guessed beside an installed package: here, the repository these tests run in."""
    from cooper_openrlhf.lab.batch import is_checkout_root, package_checkout

    checkout = Path(__file__).resolve().parents[1]
    assert package_checkout() == checkout and is_checkout_root(checkout)
    assert not is_checkout_root(checkout / "cooper_openrlhf")  # a folder inside a checkout, as a venv in a clone


def test_a_re_report_that_ran_no_run_keeps_the_labs_record(tmp_path):
    from cooper_openrlhf.cli.lab import write_record

    record = tmp_path / "lab.json"
    assert write_record(record, {"command": "--seeds 8", "wall_seconds": 3491.6}, ran=5)
    assert not write_record(record, {"command": "--seeds 3", "wall_seconds": 116.3}, ran=0)  # a re-report
    assert json.loads(record.read_text())["command"] == "--seeds 8"
    assert write_record(record, {"command": "--seeds 9"}, ran=1)  # a run ran: this invocation's record
    assert write_record(tmp_path / "new.json", {"command": "--seeds 1"}, ran=0)  # the first record is written


def test_a_batch_run_two_at_a_time_passes_the_labs_the_plans_arguments_unchanged(repo, tmp_path):
    """`cli.batch PLAN --parallel-runs 2`: each seed's lab gets the plan's arguments and seeds as registered, with the
    execution option after them (a plan that names it too is overridden, as argparse keeps the last)."""
    from cooper_openrlhf.lab.batch import run_batch

    calls = []
    plan = {"commit": _git(repo, "rev-parse", "HEAD"), "out": str(tmp_path / "labs"),
            "labs": [{"name": "main", "seeds": 2, "args": ["--preset", "style", "--run-timeout", "3600"]}]}
    assert run_batch(plan, repo, lambda argv: calls.append(argv) or 0, parallel_runs=2) == 0
    folder = str(tmp_path / "labs" / "main")
    assert calls == [["--preset", "style", "--run-timeout", "3600", "--seeds", str(k), "--out", folder,
                      "--parallel-runs", "2"] for k in (1, 2)]
    calls.clear()
    run_batch(plan, repo, lambda argv: calls.append(argv) or 0)
    assert all("--parallel-runs" not in argv for argv in calls)  # one at a time unless asked
    from cooper_openrlhf.cli import lab as lab_cli

    assert lab_cli.parse_args(["--preset", "style", "--parallel-runs", "1", "--parallel-runs", "2"]).parallel_runs == 2
