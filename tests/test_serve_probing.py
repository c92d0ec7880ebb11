"""The service reads the probe suite on its current RM every N steps: `/metrics` and the steps' log show what the
RM pays each attack form and its premium over canonical wrong answers (serve/probing.py, rm/probes.py)."""

import json
import re
import threading
import time

import pytest
import requests
from test_serve_http import RunningService

from cooper_openrlhf.data.records import MathProblem
from cooper_openrlhf.rm.probes import WRONG_FORMS
from cooper_openrlhf.serve.probing import ServiceProbe, problems_of

PROBLEMS = [MathProblem(f"What is {a} + {b}?", str(a + b), "test", i) for i, (a, b) in enumerate([(2, 3), (7, 4)])]


def _step_gauges(text: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'cooper_serve_round\{key="([^"]+)"\} (\S+)', text)}


def test_metrics_show_the_current_rms_pay_and_premium_per_attack_form(model_dir, tmp_path):
    probe = ServiceProbe(PROBLEMS, every=1)
    service = RunningService(model_dir, tmp_path, group_size=2, groups_per_update=1, probe=probe)
    try:
        body = service.body("What is 9 + 9?", "18", "The answer is 18.")
        for _ in range(2):  # one group of 2: one step
            assert requests.post(service.url + "/get_reward", json=body, timeout=30).status_code == 200
        for _ in range(100):  # the step runs in the background once its group completes
            gauges = _step_gauges(requests.get(service.url + "/metrics", timeout=10).text)
            if "cooper_probe_pay_exploit" in gauges:
                break
            time.sleep(0.1)
        steps = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
        direct = probe.read(service.service.scorer)
    finally:
        service.stop()
    for form in ("right", "wrong", *WRONG_FORMS):
        assert 0 < gauges[f"cooper_probe_pay_{form}"] < 1
    assert gauges["cooper_probe_premium_exploit"] == pytest.approx(
        gauges["cooper_probe_pay_exploit"] - gauges["cooper_probe_pay_wrong"], abs=1e-6)
    # What /metrics shows is the RM's own pay of the suite, as reading it directly gives.
    assert steps[0]["cooper/probe_pay/exploit"] == pytest.approx(direct["cooper/probe_pay/exploit"], abs=1e-5)


def test_probes_are_read_every_n_steps_only():
    probe = ServiceProbe(PROBLEMS, every=3)
    assert [probe.due(i) for i in range(7)] == [True, False, False, True, False, False, True]


def test_a_probe_file_names_its_bad_row(tmp_path):
    path = tmp_path / "probes.jsonl"
    path.write_text(json.dumps({"input": "What is 1 + 1?", "label": "2"}) + "\n" + json.dumps({"input": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"probes.jsonl:2: field 'label' is missing"):
        problems_of(str(path))


def test_probe_reads_during_scoring_traffic_fail_neither(model_dir):
    """The probe suite is read in the learner thread while the scoring lane encodes requests with the same RM: each
    encodes with its own tokenizer, so neither raises the fast tokenizer's "Already borrowed" (a short max_length
    makes every call change the truncation state, as a long request does)."""
    from cooper_openrlhf.rm.model import load_rm
    from cooper_openrlhf.rm.scorer import RMScorer

    model, tokenizer, version = load_rm(model_dir("tiny-qwen2-rm"))
    scorer = RMScorer(model, tokenizer, max_length=48, template_version=version, batch_size=8)
    probe = ServiceProbe(PROBLEMS, every=1)
    quiet = probe.read(scorer)
    failures, done = [], threading.Event()

    def scoring_lane():
        k = 0
        while not done.is_set():
            k += 1
            try:
                scorer.logits_of([(0, "What is 2 + 3?", "5", "step " * (k % 30) + "The answer is 5.")])
            except Exception as exc:
                failures.append(repr(exc))

    lane = threading.Thread(target=scoring_lane)
    lane.start()
    try:
        readings = [probe.read(scorer) for _ in range(8)]
    finally:
        done.set()
        lane.join()
    assert failures == []
    for reading in readings:
        assert reading == pytest.approx(quiet, abs=1e-5)
