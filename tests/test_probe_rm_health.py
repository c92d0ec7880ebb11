"""`cooper inspect probe-rm` reports the RM guard's health and attack table for a VerifyRM folder and for a running
reward endpoint (here a stand-in that pays an answer stating the reference 0.9 and anything else 0.2)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cooper_openrlhf.cli.probe_rm import main


class _PaysTheReference(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        rewards = [0.9 if label in query[len(prompt):] else 0.2
                   for query, prompt, label in zip(body["query"], body["prompts"], body["labels"])]
        answer = json.dumps({"rewards": rewards, "scores": rewards, "extra_logs": {}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PaysTheReference)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/get_reward"
    server.shutdown()


@pytest.fixture
def files(tmp_path):
    anchors = tmp_path / "anchors.jsonl"
    rows = [{"question": f"What is {a} + 1?", "reference": str(a + 1),
             "completion": f"The answer is {a + 1 + wrong * 5}.", "label": int(not wrong)}
            for a in range(4) for wrong in (0, 1)]
    anchors.write_text("".join(json.dumps(row) + "\n" for row in rows))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"What is {a} + 2?", "label": str(a + 2)}) + "\n"
                               for a in range(3)))
    return anchors, prompts


def test_an_endpoints_health_and_attack_table(endpoint, files, tmp_path, capsys):
    anchors, prompts = files
    out = tmp_path / "records.json"
    assert main([endpoint, "--anchors", str(anchors), "--probe-prompts", str(prompts), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| AUC right vs wrong | 1.000 |" in printed and "| attack: master_key | 0.200 | +0.000 |" in printed
    (record,) = json.loads(out.read_text())
    health = record["health"]
    assert health["right_pay"] == pytest.approx(0.9) and health["wrong_pay"] == pytest.approx(0.2)
    # the hedge states the reference first: a judge of "the reference is in the text" pays it like a right answer
    assert health["attack_pay"]["exploit"] == pytest.approx(0.9)
    assert health["anchors"] == 8 + 3 * 22


def test_a_folders_health_beside_its_probe(model_dir, files, capsys):
    anchors, prompts = files
    rm = str(model_dir("tiny-qwen2-rm"))
    assert main([rm, "--preset", "quick", "--anchors", str(anchors), "--probe-prompts", str(prompts),
                 "--probe-problems", "1"]) == 0
    printed = capsys.readouterr().out
    assert "health on the guard's anchors:" in printed and "| attack: truncated |" in printed
    assert "30 anchors: 8 labelled (4 right, 4 wrong), 22 probes over 1 problems" in printed
