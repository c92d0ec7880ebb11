"""How the lab runs its arms: a run that fails (a real train_cooper process, stopped by its own input check before
Ray starts) recorded and reported, a run past its timeout or a lab stopped by SIGTERM taking every process it started
with it, runs side by side (longest first, reported in plan order), and the one retry a failure to start earns."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cooper_openrlhf.lab import runner as lab_runner
from cooper_openrlhf.lab.presets import PRESETS
from cooper_openrlhf.lab.runner import LabFiles, read_info, run_arm
from cooper_openrlhf.lab.task import write_task_files


def _files(tmp_path: Path) -> LabFiles:
    return LabFiles(root=tmp_path, policy=tmp_path / "policy", rm=tmp_path / "verifyrm" / "best")


def test_a_failed_run_is_recorded_with_its_log_reported_as_failed_and_a_done_run_is_not_redone(tmp_path):
    files = _files(tmp_path)
    write_task_files(tmp_path / "data", PRESETS["tiny"].task, rl_prompts=8)
    files.rm.mkdir(parents=True)  # an RM folder without a model: train_cooper refuses it before starting Ray
    info = run_arm(PRESETS["tiny"], files, "static", seed=0, timeout_s=300)
    run = files.run_dir("static", 0)
    assert info["status"] == "failed" and info["exit"] != 0 and read_info(run) == info
    assert str(files.rm) in Path(info["log"]).read_text()  # the log names what was wrong

    done = files.run_dir("rule", 0)
    done.mkdir(parents=True)
    (done / "run_info.json").write_text(json.dumps({"arm": "rule", "seed": 0, "status": "done", "log": "x"}))
    assert run_arm(PRESETS["tiny"], files, "rule", seed=0)["status"] == "done"  # skipped: no process started
    assert sorted(p.name for p in done.iterdir()) == ["run_info.json"]

    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.report", str(run), "--out", str(tmp_path / "r")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1  # no run could be read: the report still renders and says why
    assert f"**failed**: exit status {info['exit']}; log: {info['log']}" in (tmp_path / "r" / "report.md").read_text()


# A stand-in for train_cooper that, like it, starts processes of its own (Ray's, vLLM's): it writes its pid and its
# child's, then both sleep.
PROCESS_TREE = ("import os, pathlib, subprocess, sys, time\n"
                "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                "pathlib.Path(sys.argv[1]).write_text(f'{os.getpid()} {child.pid}')\n"
                "time.sleep(600)\n")


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _all_gone(pids: list[int], within_s: float = 10.0) -> bool:
    """True once none of `pids` runs (a signalled process may take a moment to exit)."""
    deadline = time.monotonic() + within_s
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _await_pids(path: Path, timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while not (path.is_file() and path.read_text()):
        assert time.monotonic() < deadline, "the stand-in run never started"
        time.sleep(0.05)
    return [int(pid) for pid in path.read_text().split()]


def test_a_run_past_its_timeout_is_stopped_with_every_process_it_started(tmp_path):
    pids, log = tmp_path / "pids", tmp_path / "run.log"
    # 10 s: time enough for the stand-in to start its child on a loaded machine, so both are there to stop.
    assert lab_runner._launch([sys.executable, "-c", PROCESS_TREE, str(pids)], log, timeout_s=10) == -9
    started = [int(pid) for pid in pids.read_text().split()]
    assert len(started) == 2 and _all_gone(started)
    assert "[lab] killed after 10 s" in log.read_text()


# A stand-in for a run that fails and leaves a process of its own running, as a vLLM EngineCore can outlive a
# failed run's Ray actor.
FAILS_LEAVING_A_CHILD = ("import pathlib, subprocess, sys\n"
                         "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                         "pathlib.Path(sys.argv[1]).write_text(str(child.pid))\n"
                         "sys.exit(1)\n")


def test_what_a_run_leaves_running_when_it_ends_is_stopped_before_the_next_run_starts(tmp_path):
    pid = tmp_path / "pid"
    assert lab_runner._launch([sys.executable, "-c", FAILS_LEAVING_A_CHILD, str(pid)], tmp_path / "run.log", None) == 1
    assert _all_gone([int(pid.read_text())])


def test_a_lab_stopped_by_sigterm_stops_its_run_in_progress_with_every_process_it_started(tmp_path):
    """A resumed lab restarts an interrupted run in the same folder: nothing of the last attempt may still run."""
    pids = tmp_path / "pids"
    lab = ("import sys; from pathlib import Path\n"
           "from cooper_openrlhf.lab import runner\n"
           "runner.stop_runs_on_sigterm()\n"
           "runner._launch([sys.executable, '-c', sys.argv[1], sys.argv[2]], Path(sys.argv[3]), None)\n")
    process = subprocess.Popen([sys.executable, "-c", lab, PROCESS_TREE, str(pids), str(tmp_path / "run.log")])
    started = _await_pids(pids)
    assert all(_alive(pid) for pid in started)  # the run and its child, in a session of their own
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    assert _all_gone(started)


# A stand-in for train_cooper that records when it ran: "<arm> <start> <end>" into its own file.
TIMED_RUN = ("import pathlib, sys, time\n"
             "start = time.time(); time.sleep(float(sys.argv[3]))\n"
             "pathlib.Path(sys.argv[1]).write_text(f'{sys.argv[2]} {start} {time.time()}')\n")


def test_runs_side_by_side_start_longest_first_overlap_and_report_in_plan_order(tmp_path, monkeypatch):
    files = _files(tmp_path)
    # The co-trained RM's run takes longest; beside it the frozen RM's, then the rule arm's in the freed slot.
    seconds = {"cooper": 4.0, "static": 1.5, "rule": 1.5}
    monkeypatch.setattr(lab_runner, "train_cooper_argv", lambda preset, files, arm, seed: [
        sys.executable, "-c", TIMED_RUN, str(tmp_path / f"{arm}.times"), arm, str(seconds[arm])])
    plan = [("rule", 0), ("static", 0), ("cooper", 0)]
    finished = []
    infos = lab_runner.run_arms(PRESETS["quick"], files, plan, parallel=2, on_done=finished.append)
    assert [(i["arm"], i["status"]) for i in infos] == [("rule", "done"), ("static", "done"), ("cooper", "done")]
    assert sorted(i["arm"] for i in finished) == ["cooper", "rule", "static"]
    span = {arm: tuple(map(float, (tmp_path / f"{arm}.times").read_text().split()[1:])) for arm in seconds}
    assert span["cooper"][0] < span["static"][1] and span["static"][0] < span["cooper"][1]  # side by side
    assert span["rule"][0] >= span["static"][1] - 0.5  # the rule run waited for a free slot: it was last in line
    assert span["rule"][0] < span["cooper"][1]  # ... and filled it while the long run went on
    assert lab_runner.expected_cost("cooper") > lab_runner.expected_cost("static") > lab_runner.expected_cost("rule")


def test_a_lab_stopped_by_sigterm_stops_every_run_side_by_side_and_leaves_them_to_be_redone(tmp_path):
    lab = ("import sys; from pathlib import Path\n"
           "from cooper_openrlhf.lab import runner\n"
           "from cooper_openrlhf.lab.presets import PRESETS\n"
           "root = Path(sys.argv[2])\n"
           "runner.train_cooper_argv = lambda preset, files, arm, seed: [sys.executable, '-c', sys.argv[1],\n"
           "                                                             str(root / f'{arm}.pids')]\n"
           "runner.stop_runs_on_sigterm()\n"
           "files = runner.LabFiles(root=root, policy=root / 'policy', rm=root / 'rm')\n"
           "runner.run_arms(PRESETS['quick'], files, [('rule', 0), ('static', 0), ('cooper', 0)], parallel=2)\n")
    process = subprocess.Popen([sys.executable, "-c", lab, PROCESS_TREE, str(tmp_path)])
    started = _await_pids(tmp_path / "cooper.pids") + _await_pids(tmp_path / "static.pids")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    assert _all_gone(started)
    assert not (tmp_path / "rule.pids").exists()  # never started once the lab was stopping
    files = _files(tmp_path)
    assert [read_info(files.run_dir(arm, 0)).get("status") for arm in ("static", "cooper")] == ["running", "running"]


def _scripted_run(marker: Path, first_output: str) -> list[str]:
    """A command standing in for train_cooper: prints `first_output` and fails on its first start, then succeeds."""
    code = (f"import pathlib, sys; m = pathlib.Path({str(marker)!r})\n"
            f"if m.exists(): print('trained'); sys.exit(0)\n"
            f"m.touch(); print({first_output!r}); sys.exit(1)")
    return [sys.executable, "-c", code]


@pytest.mark.parametrize("first_output, status, attempts", [
    ("torch.distributed.DistNetworkError: ... EADDRINUSE, message: address already in use", "done", 2),
    ("Exception: The current node timed out during startup. This could happen because some of the raylet failed "
     "to startup or the GCS has become overloaded.", "done", 2),
    ("ValueError: --reward.model_name_or_path is not a model", "failed", 1),  # a real error is not retried
])
def test_only_a_failure_to_start_through_no_fault_of_the_run_is_started_once_more(first_output, status, attempts,
                                                                                  tmp_path, monkeypatch):
    from cooper_openrlhf.lab import runner

    marker = tmp_path / "started-once"
    monkeypatch.setattr(runner, "train_cooper_argv", lambda *a: _scripted_run(marker, first_output))
    info = run_arm(PRESETS["tiny"], _files(tmp_path), "static", seed=0)
    run = _files(tmp_path).run_dir("static", 0)
    assert info["status"] == status and read_info(run) == info
    assert (run / "run.start-failed.log").is_file() == (attempts == 2)
    if attempts == 2:  # the first attempt's log is kept beside the second's
        assert (run / "run.start-failed.log").read_text().strip() == first_output
        assert "trained" in (run / "run.log").read_text()
