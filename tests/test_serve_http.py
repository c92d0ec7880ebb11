"""The reward service over real HTTP (uvicorn on a loopback port, the real tiny RM and rule-verifier pools, no
learning): OpenRLHF's request shape answered with the RM's own scores, auth, every bad input's status, /metrics,
1,000 concurrent requests none lost, and a hung verification that answers at its deadline while others flow."""

import asyncio
import json
import re
import socket
import threading
import time

import aiohttp
import pytest
import requests
import torch

QUESTIONS = [(f"What is {a} + {b}?", str(a + b)) for a, b in [(2, 3), (7, 4), (10, 5), (6, 6)]]
TOKEN = "s3cret-token-0123456789"
TOWER = "\\boxed{9^{9^{9^{9}}}}"  # math-verify hangs on it (tests/test_verify_pool.py)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RunningService:
    """A RewardService behind uvicorn in a thread; `url`, `service`, `stop()`."""

    def __init__(self, model_dir, tmp_path, *, token=None, verify_deadline_s=5.0, lanes=2, max_request_samples=64,
                 max_body_bytes=1 << 20, group_size=2, mode="rm", chat_template=True, tensorboard=False,
                 app_options: dict | None = None, probe=None, **service_config):
        import uvicorn
        from transformers import AutoTokenizer

        from cooper_openrlhf.rm.model import load_rm
        from cooper_openrlhf.serve.app import build_app
        from cooper_openrlhf.serve.metrics import ServiceLog
        from cooper_openrlhf.serve.protocol import PromptSplitter
        from cooper_openrlhf.rm.scorer import RMScorer
        from cooper_openrlhf.serve.service import RewardService, ServiceConfig
        from cooper_openrlhf.verify.pool import VerifierPool
        from cooper_openrlhf.verify.rule import RuleVerifierConfig

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir("tiny-qwen2-policy"))
        model, rm_tokenizer, version = load_rm(model_dir("tiny-qwen2-rm"))
        self.rm = (model, rm_tokenizer, version)
        scorer = RMScorer(model, rm_tokenizer, max_length=256, template_version=version, batch_size=64)
        # math-verify's own alarms off: only the pool's deadline ends a hung item
        config = RuleVerifierConfig(parse_timeout_s=600, compare_timeout_s=600)
        self.pools = [VerifierPool(num_workers=1, deadline_s=verify_deadline_s, config=config) for _ in range(lanes)]
        lanes_fns = [lambda r, c, pool=pool: pool.verify_batch(r, c).outcomes for pool in self.pools]
        self.service = RewardService(ServiceConfig(mode=mode, group_size=group_size, max_batch=64, max_wait_s=0.002,
                                                   **service_config),
                                     scorer, lanes_fns, ServiceLog(str(tmp_path / "logs"), tensorboard=tensorboard),
                                     probe=probe)
        splitter = (PromptSplitter.from_tokenizer(self.tokenizer) if chat_template
                    else PromptSplitter(special_tokens=self.tokenizer.all_special_tokens))
        app = build_app(self.service, splitter, token=token,
                        max_body_bytes=max_body_bytes, max_request_samples=max_request_samples, **(app_options or {}))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                break
            time.sleep(0.05)
        assert self.server.started

    def prompt(self, question: str) -> str:
        return self.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                  add_generation_prompt=True)

    def body(self, question: str, reference: str, completion: str) -> dict:
        prompt = self.prompt(question)
        return {"query": [prompt + completion + "<|im_end|>"], "prompts": [prompt], "labels": [reference]}

    def direct_logits(self, triples) -> list[float]:
        from cooper_openrlhf.rm.model import score_logits

        model, tokenizer, version = self.rm
        q, r, c = (list(x) for x in zip(*triples))
        return score_logits(model, tokenizer, q, r, c, max_length=256, template_version=version, batch_size=64)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
        for pool in self.pools:
            pool.close()


@pytest.fixture
def service(model_dir, tmp_path):
    running = RunningService(model_dir, tmp_path, token=TOKEN)
    yield running
    running.stop()


def auth(token=TOKEN):
    return {"Authorization": f"Bearer {token}"}


def test_openrlhfs_request_gets_the_rms_own_reward_and_extra_logs(service):
    question, reference = QUESTIONS[0]
    response = requests.post(service.url + "/get_reward", json=service.body(question, reference, "The answer is 5."),
                             headers=auth())
    assert response.status_code == 200, response.text
    data = response.json()
    logit = service.direct_logits([(question, reference, "The answer is 5.")])[0]
    assert data["rewards"] == pytest.approx([torch.sigmoid(torch.tensor(logit)).item()], abs=1e-5)
    assert data["scores"] == data["rewards"]
    assert data["extra_logs"] == {"cooper/rule_correct": [1.0], "cooper/rm_logit": [pytest.approx(logit, abs=1e-4)],
                                  "cooper/rm_version": [0.0]}


def test_the_token_is_required_and_accepted_as_bearer_or_query(service):
    body = service.body(*QUESTIONS[1], "The answer is 11.")
    assert requests.post(service.url + "/get_reward", json=body).status_code == 401
    assert requests.post(service.url + "/get_reward", json=body, headers=auth("wrong-token")).status_code == 401
    assert requests.post(service.url + f"/get_reward?token={TOKEN}x", json=body).status_code == 401
    assert requests.post(service.url + f"/get_reward?token={TOKEN}", json=body).status_code == 200
    assert requests.get(service.url + "/metrics").status_code == 401
    assert requests.get(service.url + "/metrics", headers=auth()).status_code == 200
    assert requests.get(service.url + "/nowhere").status_code == 401
    assert requests.get(service.url + "/nowhere", headers=auth()).status_code == 404
    wrong_method = requests.get(service.url + "/get_reward", headers=auth())
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"


@pytest.mark.parametrize("mutate, status, words", [
    (lambda b: b.pop("labels"), 400, "'labels' is missing"),
    (lambda b: b.update(prompts=b["prompts"] * 2), 400, "disagree in length"),
    (lambda b: b.update(prompts=["Question: what?"]), 400, "sample 0: prompt does not match"),
    (lambda b: b.update(query=["x" * (2 << 20)]), 413, "at most"),
    (lambda b: b.update(query=b["query"] * 65, prompts=b["prompts"] * 65, labels=b["labels"] * 65), 413, "at most 64"),
])
def test_bad_requests_are_refused_naming_what_is_wrong(service, mutate, status, words):
    body = service.body(*QUESTIONS[0], "The answer is 5.")
    mutate(body)
    response = requests.post(service.url + "/get_reward", json=body, headers=auth())
    assert response.status_code == status and words in response.json()["error"]
    not_json = requests.post(service.url + "/get_reward", data=b"{oops", headers=auth())
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]


def test_metrics_are_prometheus_text(service):
    for _ in range(6):  # lone requests, one after another: the scorer times both thread counts at one row
        requests.post(service.url + "/get_reward", json=service.body(*QUESTIONS[0], "The answer is 5."),
                      headers=auth())
    text = requests.get(service.url + "/metrics", headers=auth()).text
    assert 'cooper_serve_requests_total{route="/get_reward",status="200"} 6.0' in text
    assert 'cooper_serve{name="rm_version"} 0.0' in text
    assert "cooper_serve_request_seconds_bucket" in text
    if service.service.scorer.threads and len(service.service.scorer.threads.choices) == 2:  # a CPU of 2+ threads
        assert re.search(r'cooper_serve\{name="rm_threads_rows_1"\} [12]\.0', text), text


async def _post_many(url: str, bodies: list[dict], headers: dict) -> list[tuple[int, dict]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=180)) as session:
        async def one(body):
            async with session.post(url, json=body, headers=headers) as response:
                return response.status, await response.json()
        return await asyncio.gather(*(one(b) for b in bodies))


def test_a_thousand_concurrent_requests_are_all_answered_with_real_scores(service):
    """None lost, none answered by a failure-zero: every reward equals the RM's own score of that sample."""
    triples = [(q, r, f"Step {k}: the answer is {int(r) + k % 3}.") for k in range(250) for q, r in QUESTIONS]
    bodies = [service.body(*t) for t in triples]
    results = asyncio.run(_post_many(service.url + "/get_reward", bodies, auth()))
    assert [status for status, _ in results] == [200] * 1000
    expected = torch.sigmoid(torch.tensor(service.direct_logits(triples))).tolist()
    got = [data["rewards"][0] for _, data in results]
    assert got == pytest.approx(expected, abs=1e-4)
    assert service.service.rm_batcher.stats.largest > 1  # requests were batched together
    assert service.service.counters["samples"] == 1000
    assert not service.service.groups.open and not service.service.ready  # no learner, no steps: nothing kept


def test_a_hung_verification_answers_at_its_deadline_while_others_flow(model_dir, tmp_path):
    deadline = 8.0  # long beside the others' answers, so that a loaded machine cannot blur the two
    running = RunningService(model_dir, tmp_path, verify_deadline_s=deadline)
    try:
        async def scenario():
            hung = asyncio.ensure_future(_post_many(running.url + "/get_reward",
                                                    [running.body("What is 9?", "9", TOWER)], {}))
            await asyncio.sleep(0.3)
            start = time.monotonic()
            others = await _post_many(running.url + "/get_reward",
                                      [running.body(q, r, f"The answer is {r}.") for q, r in QUESTIONS * 5], {})
            others_took = time.monotonic() - start
            return await hung, others, others_took, time.monotonic() - start

        hung, others, others_took, hung_took = asyncio.run(scenario())
        assert [s for s, _ in others] == [200] * 20 and all(d["extra_logs"]["cooper/rule_correct"] == [1.0]
                                                             for _, d in others)
        assert others_took < deadline / 2  # well inside the hung item's deadline
        status, data = hung[0]
        assert status == 200 and data["extra_logs"]["cooper/rule_correct"] == [0.0]  # TIMEOUT is not correct
        assert 0 < data["rewards"][0] < 1  # still the RM's real reward
        assert deadline - 1.0 <= hung_took < deadline + 3.0  # it did hang (sent 0.3 s before the clock), cut at its deadline
    finally:
        running.stop()


def test_past_the_memory_bound_a_request_is_refused_with_retry_after_and_served_once_it_drains(model_dir, tmp_path):
    """The memory bound (here 1 sample in flight) refuses at once with Retry-After; nothing below it is refused."""
    running = RunningService(model_dir, tmp_path, verify_deadline_s=3.0, app_options={"max_queued_samples": 1})
    try:
        async def scenario():
            held = asyncio.ensure_future(_post_many(running.url + "/get_reward",  # in flight until its deadline
                                                    [running.body("What is 9?", "9", TOWER)], {}))
            await asyncio.sleep(0.5)
            async with aiohttp.ClientSession() as session:
                async with session.post(running.url + "/get_reward",
                                        json=running.body(*QUESTIONS[0], "The answer is 5.")) as response:
                    refused = response.status, response.headers.get("Retry-After"), (await response.json())["error"]
            return await held, refused

        held, refused = asyncio.run(scenario())
        after = requests.post(running.url + "/get_reward", json=running.body(*QUESTIONS[0], "The answer is 5."))
        health = requests.get(running.url + "/health").json()
    finally:
        running.stop()
    assert held[0][0] == 200
    status, retry_after, error = refused
    assert status == 503 and 1 <= int(retry_after) <= 60 and "--max-queued-samples" in error
    assert after.status_code == 200 and health["refused_over_memory_bound"] == 1 and health["in_flight_samples"] == 0


def test_rule_mode_pays_the_verifier(model_dir, tmp_path):
    running = RunningService(model_dir, tmp_path, mode="rule")
    try:
        right = requests.post(running.url + "/get_reward", json=running.body("What is 2 + 3?", "5", "It is 5. #### 5"))
        wrong = requests.post(running.url + "/get_reward", json=running.body("What is 2 + 3?", "5", "The answer is 6."))
        assert right.json()["rewards"] == [1.0] and wrong.json()["rewards"] == [0.0]
        health = requests.get(running.url + "/health").json()
        assert health["mode"] == "rule" and json.dumps(health)
    finally:
        running.stop()


def test_a_hacking_alarm_switches_the_service_to_the_rule_reward(model_dir, tmp_path):
    """The trainer's alarm rule on what the service sees: an RM paying ~0.5 for answers the verifier rejects
    (rule B, gap over the ceiling for a window of steps) turns the alarm on, and `rule_reward` pays 0 from then."""
    from cooper_openrlhf.algo.hacking import HackingMonitorConfig

    monitor = HackingMonitorConfig(window=3, gap_ceiling=0.3, rules="B")
    running = RunningService(model_dir, tmp_path, groups_per_update=1, on_hacking="rule_reward", monitor=monitor,
                             tensorboard=True)
    try:
        paid = []
        for k in range(5):
            question = f"What is {k} + 10?"
            for wrong in (k + 11, k + 12):  # the group's two samples, both wrong
                paid.append(requests.post(running.url + "/get_reward",
                                          json=running.body(question, str(k + 10), f"The answer is {wrong}.")).json())
            for _ in range(3000):  # the step is read in the background (a minute's grace on a loaded machine)
                if running.service.counters["rounds"] > k:
                    break
                time.sleep(0.02)
    finally:
        running.stop()
    # Read after the stop, as the report reads it below: every step's line and scalar are written by then.
    steps = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    alarms = [r["cooper/hacking_alarm"] for r in steps]
    assert alarms[:2] == [0.0, 0.0] and alarms[2] == 1.0  # fires once the window of 3 steps is full
    assert all(0.3 < r["cooper/reward_hacking_gap"] < 0.7 for r in steps)
    assert [p["rewards"][0] > 0.3 for p in paid[:6]] == [True] * 6  # the RM's pay, before and at the alarm
    assert [p["rewards"][0] for p in paid[6:]] == [0.0] * 4  # the rule's from the step after
    assert steps[-1]["cooper/reward_from_rule"] == 1.0  # the core's key, the trainer's too
    from cooper_openrlhf.report.runs import load_run

    run = load_run(tmp_path / "logs")  # the package's report reads a service run like a training run
    assert run.arm == "reward-service" and [v for _, v in run.scalars["cooper/hacking_alarm"]] == alarms
