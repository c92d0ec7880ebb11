"""The service reads the probe suite on its current RM every N rounds: `/metrics` and the rounds' log show what the
RM pays each attack form and its premium over canonical wrong answers (serve/probing.py, rm/probes.py)."""

import json
import re
import time

import pytest
import requests
from test_serve_http import RunningService

from cooper_openrlhf.data.records import MathProblem
from cooper_openrlhf.rm.probes import WRONG_FORMS
from cooper_openrlhf.serve.probing import ServiceProbe, problems_of

PROBLEMS = [MathProblem(f"What is {a} + {b}?", str(a + b), "test", i) for i, (a, b) in enumerate([(2, 3), (7, 4)])]


def _round_gauges(text: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'cooper_serve_round\{key="([^"]+)"\} (\S+)', text)}


def test_metrics_show_the_current_rms_pay_and_premium_per_attack_form(model_dir, tmp_path):
    probe = ServiceProbe(PROBLEMS, every=1)
    service = RunningService(model_dir, tmp_path, group_size=2, groups_per_update=1, probe=probe)
    try:
        body = service.body("What is 9 + 9?", "18", "The answer is 18.")
        for _ in range(2):  # one group of 2: one round
            assert requests.post(service.url + "/get_reward", json=body, timeout=30).status_code == 200
        for _ in range(100):  # the round runs in the background once its group completes
            gauges = _round_gauges(requests.get(service.url + "/metrics", timeout=10).text)
            if "cooper_probe_pay_exploit" in gauges:
                break
            time.sleep(0.1)
        rounds = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
        direct = probe.read(service.service.scorer)
    finally:
        service.stop()
    for form in ("right", "wrong", *WRONG_FORMS):
        assert 0 < gauges[f"cooper_probe_pay_{form}"] < 1
    assert gauges["cooper_probe_premium_exploit"] == pytest.approx(
        gauges["cooper_probe_pay_exploit"] - gauges["cooper_probe_pay_wrong"], abs=1e-6)
    # What /metrics shows is the RM's own pay of the suite, as reading it directly gives.
    assert rounds[0]["cooper/probe_pay/exploit"] == pytest.approx(direct["cooper/probe_pay/exploit"], abs=1e-5)


def test_probes_are_read_every_n_rounds_only():
    probe = ServiceProbe(PROBLEMS, every=3)
    assert [probe.due(i) for i in range(7)] == [True, False, False, True, False, False, True]


def test_a_probe_file_names_its_bad_row(tmp_path):
    path = tmp_path / "probes.jsonl"
    path.write_text(json.dumps({"input": "What is 1 + 1?", "label": "2"}) + "\n" + json.dumps({"input": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"probes.jsonl:2: field 'label' is missing"):
        problems_of(str(path))
