"""The learning reward service (`cli.serve --learn`, a real process, the tiny RM) under the faults of a long run:
a checkpoint folder that cannot be written, a kill -9 in the middle of a save, a restart with groups half scored.

OpenRLHF 0.11.2's client gives a sample 5 tries 1 s apart, then the trainer crashes: in each case every request
must still be answered 200, and learning must go on (or resume) by itself.
"""

import signal
import sys
import time
from pathlib import Path

import pytest
import requests
from test_serve_e2e import N, ServiceProcess, _send_step

pytestmark = pytest.mark.slow


def _wait_for(condition, what: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _latest(service: ServiceProcess) -> str | None:
    path = service.work / "state" / "rm" / "latest"
    return path.read_text().strip() if path.is_file() else None


@pytest.fixture
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir("tiny-qwen2-policy"))


def test_a_failing_checkpoint_is_shown_and_learning_resumes_when_the_folder_is_writable(model_dir, tokenizer,
                                                                                         tmp_path):
    service = ServiceProcess(tmp_path, model_dir("tiny-qwen2-rm"), model_dir("tiny-qwen2-policy"))
    checkpoints = tmp_path / "state" / "rm"
    try:
        _send_step(service, tokenizer, 0)
        _wait_for(lambda: _latest(service) == "version1", "the first checkpoint")

        # The checkpoint folder becomes unwritable. Tests run as root, whom chmod does not stop: a plain file takes
        # the folder's place, so creating anything in it fails (as a full or read-only disk would).
        checkpoints.rename(tmp_path / "rm.aside")
        checkpoints.write_text("not a folder")
        _send_step(service, tokenizer, 1)  # every request answered 200 (asserted inside); step 1's checkpoint fails
        _wait_for(lambda: service.health()["rm_version"] == 2, "step 1's update")

        # Scoring and learning go on while checkpoints fail; each step's checkpoint is tried again.
        answers = _send_step(service, tokenizer, 2)
        assert {a["extra_logs"]["cooper/rm_version"][0] for a in answers} == {2.0}
        _wait_for(lambda: service.health()["rm_version"] == 3, "learning to go on after a failed checkpoint", 60)

        # The failures are visible: /health says learning is failing and why, /metrics counts them.
        failing = _wait_for(lambda: (h := service.health()).get("round_failures") == 2 and h, "both failures")
        assert failing["learning"].startswith("failing: round 2: ") and "Error" in failing["learning"]
        metrics = requests.get(service.url + "/metrics", headers=service.auth, timeout=10).text
        assert 'cooper_serve{name="round_failures"} 2.0' in metrics
        assert 'cooper_serve{name="learning_failing"} 1.0' in metrics

        # Writable again: the next step learns, checkpoints, and the service says so.
        checkpoints.unlink()
        (tmp_path / "rm.aside").rename(checkpoints)
        _send_step(service, tokenizer, 3)
        _wait_for(lambda: _latest(service) == "version4", "a checkpoint once the folder is writable again")
        healthy = service.health()
        assert healthy["learning"] == "ok" and healthy["round_failures"] == 2 and healthy["updates"] == 4
    finally:
        code = service.stop()
    assert code == 0
    log = (tmp_path / "serve.log").read_text()
    assert "round 1 failed" in log and "Traceback" in log  # logged with its traceback


def test_kill_during_a_checkpoint_save_resumes_from_the_previous_checkpoint(model_dir, tokenizer, tmp_path):
    """`--keep-checkpoints 1`: the kill lands while the second checkpoint's files are half written (its model states
    on disk, its optimizer states not: tests/serve_pausing_save.py stops the save exactly there)."""
    rm, policy = model_dir("tiny-qwen2-rm"), model_dir("tiny-qwen2-policy")
    marker = tmp_path / "paused"
    pausing = [sys.executable, str(Path(__file__).parent / "serve_pausing_save.py")]
    service = ServiceProcess(tmp_path, rm, policy, "--keep-checkpoints", "1", launcher=pausing,
                             env={"COOPER_TEST_PAUSE_SAVE": "2", "COOPER_TEST_PAUSE_MARKER": str(marker)})
    _send_step(service, tokenizer, 0)
    _wait_for(lambda: service.health()["updates"] == 1 and _latest(service), "update 1 and its checkpoint")
    saved = service.health()
    _send_step(service, tokenizer, 1)
    _wait_for(marker.is_file, "the second save to reach its optimizer states")
    assert service.stop(signal.SIGKILL) == -signal.SIGKILL

    restarted = ServiceProcess(tmp_path, rm, policy, "--keep-checkpoints", "1", port=service.port)
    try:
        resumed = restarted.health()
        assert resumed["rm_version"] == 1 and resumed["updates"] == 1 and resumed["samples"] == saved["samples"]
        log = (tmp_path / "serve.log").read_text()
        assert f"resumed from checkpoint {tmp_path / 'state' / 'rm' / 'version1'} (RM version 1" in log
        answers = _send_step(restarted, tokenizer, 2)
        assert {a["extra_logs"]["cooper/rm_version"][0] for a in answers} == {1.0}
        # Version 2 was published (and paid by) before the kill and lost with it: the next update is version 3.
        assert "RM version 2 was published after the checkpoint of version 1" in log
        _wait_for(lambda: _latest(restarted) == "version3", "learning and checkpointing to go on")
    finally:
        assert restarted.stop() == 0
    # One checkpoint kept, as asked (the shutdown's, beside the periodic one it replaced), nothing left of the
    # interrupted save.
    folders = [p.name for p in (tmp_path / "state" / "rm").iterdir() if p.is_dir()]
    assert folders == ["version3.1"] and _latest(restarted) == "version3.1"


def test_a_group_half_scored_before_a_restart_is_finished_by_its_own_version(model_dir, tokenizer, tmp_path):
    """Half a group, an update (the group stays pinned to version 0), SIGTERM, restart, the rest of the group."""
    from cooper_openrlhf.rm.model import load_rm, score_logits
    from cooper_openrlhf.runtime.dtype import resolve_dtype_name, torch_dtype

    rm, policy = model_dir("tiny-qwen2-rm"), model_dir("tiny-qwen2-policy")
    question, reference = "What is 40 + 2?", "42"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                           add_generation_prompt=True)
    completions = [f"The answer is {42 + k}." for k in range(N)]

    def post(service, completion):
        body = {"query": [prompt + completion + "<|im_end|>"], "prompts": [prompt], "labels": [reference]}
        return requests.post(service.url + "/get_reward", json=body, headers=service.auth, timeout=60)

    # A half group beside a whole step of other prompts is a fault's shape, not a trainer's step: the trainer-group
    # checks (serve/trainer_groups.py) warn, and never refuse a sample.
    service = ServiceProcess(tmp_path, rm, policy)
    first = [post(service, c) for c in completions[:N // 2]]
    assert [r.status_code for r in first] == [200] * (N // 2)
    _send_step(service, tokenizer, 0)  # other prompts complete a step: update 1
    _wait_for(lambda: service.health()["rm_version"] == 1, "update 1")
    assert service.stop() == 0  # SIGTERM: the shutdown checkpoint

    restarted = ServiceProcess(tmp_path, rm, policy, port=service.port)
    try:
        rest = [post(restarted, c) for c in completions[N // 2:]]
        health = restarted.health()
    finally:
        restarted.stop()
    assert [r.status_code for r in rest] == [200] * (N - N // 2), [r.text for r in rest]
    answers = [r.json() for r in first + rest]
    # One version for the whole group, the one its first sample was scored by, and really its weights: the RM as
    # it was before any update pays the second half what the service paid.
    assert {a["extra_logs"]["cooper/rm_version"][0] for a in answers} == {0.0}
    model, rm_tokenizer, template = load_rm(rm, dtype=torch_dtype(resolve_dtype_name("auto")))
    direct = score_logits(model, rm_tokenizer, [question] * len(rest), [reference] * len(rest),
                          completions[N // 2:], max_length=256,
                          template_version=template, batch_size=8)
    assert [a["extra_logs"]["cooper/rm_logit"][0] for a in answers[N // 2:]] == pytest.approx(direct, abs=2e-2)
    assert health["groups_repinned"] == 0 and health["groups_completed"] >= 1
