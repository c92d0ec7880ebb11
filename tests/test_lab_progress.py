"""The lab's progress lines (lab/progress.py), read from what runs and stages already write: a line per run that
moves with each finished step and shows its last reward; a finished run's line says how it ended."""

import io
import json
import re

from cooper_openrlhf.lab.progress import NewRows, RunsProgress, bce_stage_update, step_bar, step_rewards

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def screen_lines(text: str) -> list[str]:
    """What a terminal would have shown, one entry per redraw (tqdm's carriage returns and cursor moves split)."""
    return [line.strip() for line in re.split(r"[\r\n]", ANSI.sub("\n", text)) if line.strip()]


def _rows(path, step, rewards, verified):
    with open(path, "a", encoding="utf-8") as handle:
        for reward, ok in zip(rewards, verified):
            handle.write(json.dumps({"step": step, "reward": reward, "verified": ok, "completion": "x"}) + "\n")


def test_new_rows_reads_each_appended_row_once_and_waits_for_a_whole_line(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    rows = NewRows(path)
    assert rows() == []  # no file yet
    path.write_text('{"step": 1}\n{"step"')
    assert rows() == [{"step": 1}]
    with open(path, "a") as handle:
        handle.write(': 2}\n')
    assert rows() == [{"step": 2}] and rows() == []
    path.write_text('{"step": 1}\n')  # a run started afresh: its log is read from the start
    assert rows() == [{"step": 1}]


def test_step_rewards_are_the_rms_pay_or_where_no_rm_pays_the_verified_share():
    rows = [{"step": 1, "reward": 0.25, "verified": False}, {"step": 1, "reward": 0.75, "verified": True},
            {"step": 2, "reward": None, "verified": True}, {"step": 2, "reward": None, "verified": False}]
    assert step_rewards(rows) == [(1, 0.5), (2, 0.5)]


def test_one_line_per_run_moves_with_each_step_and_says_how_the_run_ended(tmp_path, monkeypatch):
    shown = io.StringIO()
    monkeypatch.setattr("sys.stderr", shown)
    run_dir = lambda arm, seed: tmp_path / f"{arm}_seed{seed}"  # noqa: E731
    plan = [("static", 0), ("rule", 0), ("cooper", 0)]
    for arm, seed in plan:
        (run_dir(arm, seed) / "samples").mkdir(parents=True)
    progress = RunsProgress(plan, run_dir, steps=2, done_before={("cooper", 0)})
    for arm in ("static", "rule"):
        (run_dir(arm, 0) / "run_info.json").write_text(json.dumps({"arm": arm, "seed": 0, "status": "running"}))
    progress.update()
    _rows(run_dir("static", 0) / "samples" / "rollouts.jsonl", 1, [0.2, 0.4], [False, True])
    _rows(run_dir("rule", 0) / "samples" / "rollouts.jsonl", 1, [None, None], [True, True])
    progress.update()
    _rows(run_dir("static", 0) / "samples" / "rollouts.jsonl", 2, [0.9, 0.9], [False, False])
    progress.update()
    progress.finished({"arm": "static", "seed": 0, "status": "done", "seconds": 12.0})
    progress.finished({"arm": "rule", "seed": 0, "status": "failed", "seconds": 5.0})
    progress.close()

    lines = screen_lines(shown.getvalue())
    assert any(re.match(r"static seed 0: step 1/2 .*reward 0\.30$", line) for line in lines)
    assert any(re.match(r"static seed 0: step 2/2 .*\[\d\d:\d\d<\d\d:\d\d\], reward 0\.90$", line) for line in lines)
    assert any(re.match(r"static seed 0: step 2/2 .*reward 0\.90, done in 12 s$", line) for line in lines)
    assert any(re.match(r"rule seed 0: step 1/2 .*reward 1\.00, failed in 5 s$", line) for line in lines)
    assert any(re.match(r"cooper seed 0: step 2/2 .*done earlier$", line) for line in lines)
    assert not any("cooper seed 0: step 0/2" in line for line in lines)


def test_the_bce_stages_line_counts_its_optimizer_steps_against_the_total_it_logged(tmp_path, monkeypatch):
    shown = io.StringIO()
    monkeypatch.setattr("sys.stderr", shown)
    bar = step_bar("preparation: starting RM, BCE stage", None)
    log = tmp_path / "verifyrm.log"
    update = bce_stage_update(tmp_path, log, bar)
    update()
    log.write_text("training on 96 rows (...); 1 ranks, micro batch 8, accumulation 2, 12 micro batches per epoch "
                   "per rank, 18 optimizer steps, ZeRO-0 fp32\n")
    with open(tmp_path / "metrics.jsonl", "w") as handle:
        for step in (1, 2, 3):
            handle.write(json.dumps({"kind": "train", "step": step, "loss": 0.7 - 0.1 * step}) + "\n")
    update()
    bar.close()
    lines = screen_lines(shown.getvalue())
    assert any(re.match(r"preparation: starting RM, BCE stage: step 3/18 .*loss 0\.400$", line) for line in lines)
