"""The reward service as a stock OpenRLHF run meets it: `cli.serve` started as a process with its default flags,
driven by OpenRLHF 0.11.2's own client (`SingleTurnAgentExecutor._fetch_rewards_via_http`: one sample per
request, a new connection per try, 5 tries 1 s apart, then the sample's reward is None and the trainer crashes), so
a non-200 on the first try is counted here as the failure it is in a run.

- the end of a generation phase: 1,024 prompts x 8 samples = 8,192 requests at once, every one 200 on its first
  try with the RM's own score (a busy scorer is waited for, not refused);
- one poisoned sample (a lone surrogate, which the fast tokenizer rejects) among 63 good ones sent at once: the 63
  are 200 on their first try, the poisoned one is a 400 naming its field;
- memory: 10,000 groups and 3,000 distinct unauthenticated paths leave RSS, the kept groups and /metrics flat.

Only `--dtype fp32` departs from the defaults (the CPU's auto dtype may be bf16, where a logit depends on the batch
it was scored in by more than the comparison's tolerance); it changes no queue, limit or timeout.
"""

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch

TOKEN = "load-token-0123456789abcdef"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class CliService:
    """`python -m cooper_openrlhf.cli.serve` with default flags (plus `extra`) on a loopback port."""

    def __init__(self, work: Path, model_dir, *extra: str, token: str | None = None, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        work.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "cooper_openrlhf.cli.serve", "--rm", str(model_dir("tiny-qwen2-rm")),
                "--policy", str(model_dir("tiny-qwen2-policy")), "--port", str(self.port), "--dtype", "fp32", *extra]
        self.headers = {}
        if token:
            (work / "token").write_text(token)
            argv += ["--token-file", str(work / "token")]
            self.headers = {"Authorization": f"Bearer {token}"}
        self.log_path = work / "serve.log"
        self.log = open(self.log_path, "a")
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_path.read_text()[-4000:]
            try:
                if requests.get(self.url + "/health", headers=self.headers, timeout=2).ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        raise AssertionError("the service did not come up: " + self.log_path.read_text()[-4000:])

    def health(self) -> dict:
        return requests.get(self.url + "/health", headers=self.headers, timeout=30).json()

    def metrics(self) -> str:
        return requests.get(self.url + "/metrics", headers=self.headers, timeout=30).text

    def statuses(self) -> dict[str, float]:
        """/get_reward answers so far, by status."""
        return {status: float(count) for status, count in
                re.findall(r'cooper_serve_requests_total\{route="/get_reward",status="(\d+)"\} (\S+)', self.metrics())}

    def rss_mib(self, field: str = "VmRSS") -> float:
        """The process's resident memory now (VmRSS) or at its peak (VmHWM)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1)) / 1024

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()


class Policy:
    """Builds OpenRLHF's strings for the tiny policy: the chat-templated prompt, query = prompt + response + eos."""

    def __init__(self, model_dir):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir("tiny-qwen2-policy"))

    def prompt(self, question: str) -> str:
        return self.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                  add_generation_prompt=True)

    def sample(self, question: str, reference: str, response: str) -> tuple[str, str, str]:
        prompt = self.prompt(question)
        return prompt + response + "<|im_end|>", prompt, reference


def rm_rewards(model_dir, triples: list[tuple[str, str, str]]) -> list[float]:
    """sigmoid of the RM's own logits of (question, reference, response), read as the service's CLI reads the RM."""
    from cooper_openrlhf.rm.model import load_rm, recorded_max_length, score_logits, usable_max_length

    model, tokenizer, version = load_rm(str(model_dir("tiny-qwen2-rm")), dtype=torch.float32)
    max_length = usable_max_length(model, recorded_max_length(model.config))
    q, r, c = (list(column) for column in zip(*triples))
    logits = score_logits(model, tokenizer, q, r, c, max_length=max_length,
                          template_version=version, batch_size=64)
    return torch.sigmoid(torch.tensor(logits)).tolist()


async def openrlhf_rewards(url: str, samples: list[tuple[str, str, str]]) -> list:
    """Each sample through OpenRLHF's own client, all at once (as the engines' agent coroutines call it); an
    exception where the client gave up."""
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    client = SingleTurnAgentExecutor(remote_rm_url=url)

    async def one(query, prompt, label):
        answers = await client._fetch_rewards_via_http([query], [prompt], [label])
        return answers[0]["rewards"][0]

    return await asyncio.gather(*(one(*sample) for sample in samples), return_exceptions=True)


@pytest.fixture
def policy(model_dir):
    return Policy(model_dir)


def test_8192_concurrent_openrlhf_requests_all_wait_their_turn_and_are_paid_the_rms_score(model_dir, tmp_path,
                                                                                          policy):
    prompts, n = 1024, 8  # a rollout batch of 1,024 prompts x 8 samples, every sample its own request
    triples = [(f"What is {j} + {k}?", str(j + k), f"Adding them: the answer is {j + k + (k % 3) - 1}.")
               for j in range(prompts) for k in range(n)]
    service = CliService(tmp_path, model_dir)
    try:
        idle = service.rss_mib()
        start = time.monotonic()
        got = asyncio.run(openrlhf_rewards(service.url + "/get_reward", [policy.sample(*t) for t in triples]))
        took = time.monotonic() - start
        statuses, peak = service.statuses(), service.rss_mib("VmHWM")
    finally:
        service.stop()
    print(f"{prompts * n} requests answered in {took:.0f} s; server RSS {idle:.0f} MiB idle, {peak:.0f} MiB at peak")
    failed = [g for g in got if isinstance(g, BaseException)]
    assert not failed, f"{len(failed)} samples left without a reward, e.g. {failed[0]!r}"
    assert statuses == {"200": float(prompts * n)}, statuses  # every request 200 on its first try
    assert got == pytest.approx(rm_rewards(model_dir, triples), abs=1e-4)
    assert took < 170  # inside the client's 180 s


def test_a_poisoned_sample_fails_alone_among_63_good_ones_sent_at_once(model_dir, tmp_path, policy):
    triples = [(f"What is {j} + 2?", str(j + 2), f"The answer is {j + 2 + j % 2}.") for j in range(63)]
    samples = [policy.sample(*t) for t in triples]
    poisoned = policy.sample("What is 1 + 1?", "2", "The answer is \ud800 2.")  # json.loads accepts it
    service = CliService(tmp_path, model_dir)
    try:
        got = asyncio.run(openrlhf_rewards(service.url + "/get_reward", samples[:31] + [poisoned] + samples[31:]))
        statuses = service.statuses()
        refused = requests.post(service.url + "/get_reward", timeout=30, json=dict(  # sent as "\\ud800" in JSON
            zip(("query", "prompts", "labels"), ([x] for x in poisoned))))
        refusal = refused.status_code, refused.json()["error"]
    finally:
        service.stop()
    good = got[:31] + got[32:]
    assert good == pytest.approx(rm_rewards(model_dir, triples), abs=1e-4)
    assert isinstance(got[31], RuntimeError)  # the client's 5 tries were refused; it never made a reward up
    assert statuses == {"200": 63.0, "400": 5.0}, statuses  # no good sample was ever failed, not even once
    assert refusal[0] == 400 and "sample 0" in refusal[1] and "'query'" in refusal[1]


def test_memory_stays_flat_over_10000_groups_and_3000_unauthenticated_paths(model_dir, tmp_path, policy):
    """Without --learn nothing is kept per group; a 401's route label is one of the known routes or "other"."""
    size, per_request = 2, 256  # --group-size 2: 10,000 groups in 20,000 samples; 256 is --max-request-samples

    def groups(first: int, count: int) -> list[dict]:
        bodies, columns = [], ([], [], [])
        for g in range(first, first + count):
            for k in range(size):
                for column, value in zip(columns, policy.sample(f"What is {g} + 1?", str(g + 1), f"It is {g + k}.")):
                    column.append(value)
                if len(columns[0]) == per_request:
                    bodies.append(dict(zip(("query", "prompts", "labels"), columns)))
                    columns = ([], [], [])
        if columns[0]:
            bodies.append(dict(zip(("query", "prompts", "labels"), columns)))
        return bodies

    def send(service, bodies):
        for body in bodies:
            response = requests.post(service.url + "/get_reward", json=body, headers=service.headers, timeout=170)
            assert response.status_code == 200, response.text

    # glibc keeps freed memory resident, by an amount that depends on the machine's load and says nothing about what
    # is kept: a new scoring thread's own arena, and freed activations left inside the heap. So: one arena, every
    # block of 64 KiB or more (a tensor) its own mapping given back when freed, and the heap's free top trimmed at
    # once. RSS then follows what is kept.
    allocator = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    service = CliService(tmp_path, model_dir, "--group-size", str(size), token=TOKEN, env=allocator)
    try:
        send(service, groups(0, 1000))  # warm-up: allocator pools, tokenizer caches, a first 401 series
        for k in range(20):
            requests.get(f"{service.url}/warm-up/{k}", timeout=10)
        metrics_before = len(service.metrics())
        rss = [service.rss_mib()]
        for first in range(1000, 11_000, 2500):  # four quarters of 2,500 groups
            send(service, groups(first, 2500))
            rss.append(service.rss_mib())
        for k in range(3000):
            assert requests.get(f"{service.url}/probe/{k}", timeout=10).status_code == 401
        metrics_after = len(service.metrics())
        health = service.health()
    finally:
        service.stop()
    growth = [after - before for before, after in zip(rss, rss[1:])]
    print(f"RSS {' -> '.join(f'{r:.1f}' for r in rss)} MiB over four quarters of 2,500 groups; /metrics "
          f"{metrics_before} -> {metrics_after} bytes over 3,000 paths")
    assert health["samples"] == 2 * 11_000 * 1.0 and health["ready_groups"] == 0 and health["open_groups"] == 0
    assert metrics_after - metrics_before < 200  # the same series, only their numbers' digits grow
    # The exact bound is above (no group kept); RSS is the evidence that nothing else is kept per sample either.
    # What is kept per sample grows RSS in every quarter alike (keeping only a `ScoredSample` per sample adds
    # several MiB a quarter); the allocator's one-off steps (a heap extended once, a pool grown) land in one, and
    # warm caches still settle over the first quarters, more slowly under load (two halves could both catch that;
    # docs/serve.md has the readings). So the smallest quarter's growth is the reading: small whenever nothing is
    # kept.
    assert min(growth) < 1.5, growth  # MiB
