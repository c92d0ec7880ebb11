"""scripts/run_registered_batch.sh on a new machine: the batch resumes from what is committed. The driver runs from the
worktree pinned at the plan's commit, whose package predates the helpers it takes from this checkout; here the pinned
package is a stand-in that has none of them, so a helper that imported the pinned copy fails as it would there."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from cooper_openrlhf.lab.batch import archive_run

REPO = Path(__file__).resolve().parents[1]

PINNED_CLI_LAB = """import json, os, sys
from pathlib import Path
with open(os.environ["DRIVER_CALLS"], "a") as calls:
    calls.write(json.dumps(["cli.lab", *sys.argv[1:]]) + "\\n")
(Path(sys.argv[sys.argv.index("--out") + 1]) / "policy").mkdir(parents=True)
"""
PINNED_CLI_BATCH = """import json, os, sys
if "--fingerprint" in sys.argv:
    for lab in json.load(open(sys.argv[1]))["labs"]:
        print(f"{lab['name']}: the same preparation")
else:
    with open(os.environ["DRIVER_CALLS"], "a") as calls:
        calls.write(json.dumps(["cli.batch", *sys.argv[1:]]) + "\\n")
"""


def _pinned_package(root: Path) -> None:
    for module, text in {"__init__": "", "lab/__init__": "", "lab/batch": "# the plan's commit: no resume helpers\n",
                         "cli/__init__": "", "cli/lab": PINNED_CLI_LAB, "cli/batch": PINNED_CLI_BATCH}.items():
        path = root / "cooper_openrlhf" / f"{module}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _publish(checkout: Path, lab: str, arm: str) -> None:
    run = checkout / "scratch" / lab / "runs" / f"{arm}_seed0"
    run.mkdir(parents=True)
    (run / "run_info.json").write_text(json.dumps({"arm": arm, "seed": 0, "status": "done"}))
    archive_run(run, checkout / "docs" / "results" / "batch46" / lab / "runs" / f"{run.name}.tar.gz")


def test_a_new_machine_restores_the_published_runs_and_remakes_only_the_first_unfinished_preparation(tmp_path):
    checkout, pinned, out = tmp_path / "checkout", tmp_path / "pinned", tmp_path / "out"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "run_registered_batch.sh", checkout / "scripts" / "run_registered_batch.sh")
    (checkout / "cooper_openrlhf").symlink_to(REPO / "cooper_openrlhf")  # this checkout's helpers
    _pinned_package(pinned)
    labs = [{"name": name, "seeds": 1, "args": ["--arms", "rule,static", "--preparation-seed", seed]}
            for name, seed in (("prepA", "0"), ("prepB", "1"))]
    plan = checkout / "docs" / "lab" / "batch46" / "plan.json"
    plan.parent.mkdir(parents=True)
    plan.write_text(json.dumps({"commit": "0" * 40, "out": str(out), "labs": labs}))
    for lab, arms in (("prepA", ("rule", "static")), ("prepB", ("rule",))):  # prepA finished, prepB half-way
        for arm in arms:
            _publish(checkout, lab, arm)
        (checkout / "docs" / "results" / "batch46" / lab / "gates.json").write_text('{"passed": true}')
    shutil.rmtree(checkout / "scratch")
    git = ["git", "-C", str(checkout)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "docs", "scripts"], check=True)
    identity = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t"}
    env = {**os.environ, **identity, "COOPER_VENV": sys.prefix, "BATCH46_WORKTREE": str(pinned),
           "DRIVER_CALLS": str(tmp_path / "calls.jsonl"), "BATCH46_AUTOGROUP_FILE": str(tmp_path / "autogroup")}
    (tmp_path / "autogroup").write_text("1\n")  # the kernel's setting, which a test must leave alone
    subprocess.run([*git, "commit", "-qm", "plan and published runs"], check=True, env=env)

    with open(tmp_path / "driver.log", "w") as log:  # a file, not a pipe: the publisher's sleep outlives the driver
        result = subprocess.run(["bash", str(checkout / "scripts" / "run_registered_batch.sh")], stdout=log,
                                stderr=subprocess.STDOUT, env=env, timeout=120)
    assert result.returncode == 0, (tmp_path / "driver.log").read_text()

    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert calls[0] == ["cli.lab", *labs[1]["args"], "--prepare-only", "--out", str(out / "prepB")]
    assert calls[1][:2] == ["cli.batch", str(plan)] and "--publish" in calls[1] and len(calls) == 2
    restored = sorted(str(p.relative_to(out)) for p in out.glob("*/runs/*/run_info.json"))
    assert restored == ["prepA/runs/rule_seed0/run_info.json", "prepA/runs/static_seed0/run_info.json",
                        "prepB/runs/rule_seed0/run_info.json"]
    assert "could not" not in (tmp_path / "driver.log").read_text()
    assert (tmp_path / "autogroup").read_text().strip() == "0"  # so nice 19 yields the cores to other work
