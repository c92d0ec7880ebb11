"""What a public endpoint needs, tried with real clients on `cli.serve`'s own one-process server (its flags, its
builders, the tiny RM, real verifier processes): sockets that never finish their headers are closed, a connection
cap answers 503, a body that stops arriving is 408, the memory bound counts a body while it arrives, JSON nested too
deep is 400, a long prompt is split off the event loop and in linear time, slow answers to verify hold no one, and
`/healthz` answers without the token."""

import asyncio
import json
import socket
import threading
import time

import aiohttp
import pytest
import requests

TOKEN = "public-limits-token-0123456789"
TOWER = "\\boxed{9^{9^{9^{9}}}}"  # math-verify spends ~2 s on it before its own alarm fires


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class CliServer:
    """`serve.build.one_process_server` of these flags, run in a thread of this process; `url`, `stop()`."""

    def __init__(self, model_dir, tmp_path, *flags: str):
        from transformers import AutoTokenizer

        from cooper_openrlhf.cli.serve import build_parser, check_args
        from cooper_openrlhf.serve.build import one_process_server

        (tmp_path / "token").write_text(TOKEN)
        self.port = free_port()
        args = build_parser().parse_args([
            "--rm", model_dir("tiny-qwen2-rm"), "--policy", model_dir("tiny-qwen2-policy"), "--port", str(self.port),
            "--token-file", str(tmp_path / "token"), "--rm-max-length", "256", *flags])
        assert check_args(args) == []
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir("tiny-qwen2-policy"))
        self.server = one_process_server(args, TOKEN)
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.05)

    def body(self, question: str, reference: str, completion: str) -> dict:
        prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                    add_generation_prompt=True)
        return {"query": [prompt + completion + "<|im_end|>"], "prompts": [prompt], "labels": [reference]}

    def post(self, body, **kwargs) -> requests.Response:
        return requests.post(self.url + "/get_reward", json=body, headers=AUTH, timeout=60, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def serve(model_dir, tmp_path):
    """serve(*flags) -> a running CliServer, stopped after the test."""
    started = []

    def start(*flags):
        started.append(CliServer(model_dir, tmp_path, *flags))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `sock` (None: still open after `seconds`)."""
    sock.settimeout(seconds)
    start = time.monotonic()
    try:
        while sock.recv(4096):  # an answer first (a keep-alive request), then the close
            pass
    except socket.timeout:
        return None
    return time.monotonic() - start


def _raw(port: int, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    if data:
        sock.sendall(data)
    return sock


def test_liveness_needs_no_token_and_says_only_that_the_process_is_up(serve):
    server = serve()
    live = requests.get(server.url + "/healthz", timeout=10)
    assert live.status_code == 200 and live.json() == {"status": "up"}
    assert requests.get(server.url + "/health", timeout=10).status_code == 401  # how it is doing: token only
    assert requests.get(server.url + "/health", headers=AUTH, timeout=10).json()["status"] == "ok"


def test_a_socket_that_never_finishes_its_head_is_closed_at_the_header_timeout(serve):
    server = serve("--header-timeout-s", "1", "--keep-alive-s", "1")
    silent = _raw(server.port)
    partial = _raw(server.port, b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Type: appl")  # and then nothing
    answered = _raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # then idle on keep-alive
    for sock in (silent, partial, answered):
        took = _closed_within(sock, 10.0)
        assert took is not None and took < 5.0, "an idle socket was held open"
        sock.close()


def test_past_the_connection_cap_a_request_is_503_until_idle_sockets_are_closed(serve):
    server = serve("--max-connections", "4", "--header-timeout-s", "2")
    body = server.body("What is 2 + 3?", "5", "The answer is 5.")
    idle = [_raw(server.port) for _ in range(4)]
    refused = server.post(body)
    assert refused.status_code == 503
    for sock in idle:
        assert _closed_within(sock, 10.0) is not None  # the header timeout frees their places
        sock.close()
    served = server.post(body)
    assert served.status_code == 200, served.text


def test_a_body_that_stops_arriving_is_answered_408_and_the_connection_closed(serve):
    server = serve("--body-timeout-s", "1")
    sock = _raw(server.port, b"POST /get_reward HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"query\": [\"")
    sock.settimeout(10.0)
    start, answer = time.monotonic(), b""
    try:
        while chunk := sock.recv(4096):  # the server closes after its answer
            answer += chunk
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"--body-timeout-s" in answer and time.monotonic() - start < 5.0


def test_the_memory_bound_counts_a_body_while_it_arrives(serve):
    server = serve("--max-body-bytes", "4096", "--max-queued-bytes", "4096")
    uploading = _raw(server.port, b"POST /get_reward HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                     + b"\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n" + b" " * 3000)
    try:
        time.sleep(0.5)  # its 3,000 bytes are read (and counted) while it waits for the rest
        body = server.body("What is 2 + 3?", "5", "The answer is 5. " + "Indeed. " * 200)  # ~1.9 KB
        refused = server.post(body)
        assert refused.status_code == 503 and "--max-queued-bytes" in refused.json()["error"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        in_flight = requests.get(server.url + "/health", headers=AUTH, timeout=10).json()["in_flight_bytes"]
        assert in_flight == 3000
    finally:
        uploading.close()
    time.sleep(0.5)
    assert server.post(body).status_code == 200
    assert requests.get(server.url + "/health", headers=AUTH, timeout=10).json()["in_flight_bytes"] == 0


@pytest.mark.parametrize("nested", ["[" * 100_000 + "]" * 100_000,
                                    '{"query": ' + "[" * 100_000 + "]" * 100_000 + "}"])
def test_json_nested_deeper_than_the_decoder_goes_is_a_400(serve, nested):
    server = serve()
    response = requests.post(server.url + "/get_reward", data=nested.encode(), headers=AUTH, timeout=60)
    assert response.status_code == 400 and "nested too deeply" in response.json()["error"]


def test_a_long_prompt_is_split_off_the_event_loop(serve, monkeypatch):
    from cooper_openrlhf.serve.protocol import PromptSplitter

    threads = []
    split = PromptSplitter.split

    def recording_split(self, *args):
        threads.append(threading.current_thread().name)
        return split(self, *args)

    monkeypatch.setattr(PromptSplitter, "split", recording_split)
    server = serve()
    assert server.post(server.body("What is 2 + 3?", "5", "The answer is 5.")).status_code == 200
    long_question = "What is 2 + 3? " + "Think about it. " * 8000  # a 128 KB prompt
    assert server.post(server.body(long_question, "5", "The answer is 5.")).status_code == 200
    loop_thread = server.thread.name
    assert threads[0] == loop_thread and threads[1] != loop_thread


def test_splitting_a_million_character_prompt_is_linear_time():
    """Either path that reads a prompt's tail (a prompt OpenRLHF cut, and a query that matches none) on a 1 M-character
    prompt; the pure-Python search took 1.1 s on the second."""
    from cooper_openrlhf.serve.protocol import PromptSplitter, RequestError

    splitter = PromptSplitter(lambda messages: f"<u>{messages[-1]['content']}</u><a>")
    prompt = splitter.render("What is " + "x" * 1_000_000 + "?")
    start = time.perf_counter()
    assert splitter.split(prompt[len(prompt) // 2:] + "The answer is 5.", prompt, "5").completion == "The answer is 5."
    with pytest.raises(RequestError, match="does not start with its prompt"):
        splitter.split("no such start " + "y" * 1_000_000, prompt, "5")
    assert time.perf_counter() - start < 0.5


def test_the_prompt_tail_search_agrees_with_brute_force():
    import random

    from cooper_openrlhf.serve.protocol import _longest_prefix_that_ends

    rng = random.Random(0)
    for _ in range(3000):
        alphabet = rng.choice(["ab", "a", "xyzé\U0001F600"])
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        head = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        if text and rng.random() < 0.5:
            head = text[rng.randint(0, len(text)):] + head
        expected = max([k for k in range(min(len(head), len(text)) + 1) if text.endswith(head[:k])])
        assert _longest_prefix_that_ends(head, text) == expected, (head, text)


async def _timed_posts(url: str, bodies: list[dict], delay_s: float = 0.0) -> list[tuple[int, dict, float]]:
    """(status, answer, seconds from this batch's send) of each body, sent at once after `delay_s`."""
    await asyncio.sleep(delay_s)
    start = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=180)) as session:
        async def one(body):
            async with session.post(url, json=body, headers=AUTH) as response:
                return response.status, await response.json(), time.monotonic() - start
        return await asyncio.gather(*(one(body) for body in bodies))


def test_a_few_slow_answers_hold_up_no_other_sample(model_dir, tmp_path):
    """The verifier `cli.serve` builds (its defaults: 8 lanes, 4 workers, a 5 s deadline per sample), as the service
    calls it: three answers math-verify grinds on for seconds each, sent at once among 12 ordinary ones. The ordinary
    ones are verified on the other workers while the slow ones grind, and each slow one is answered by its own
    deadline (one verifier pool per lane verifying its batch in turn kept the ordinary ones of a batch behind its
    slow ones, and the slow ones behind each other). The RM is left out: on a loaded CPU its forwards would blur the
    verifier's timing."""
    from cooper_openrlhf.cli.serve import build_parser
    from cooper_openrlhf.serve.build import build_service

    args = build_parser().parse_args(["--rm", model_dir("tiny-qwen2-rm"), "--no-chat-template"])
    service, _ = build_service(args)
    slow, ordinary = ("9", TOWER), [(str(k), f"The answer is {k}.") for k in range(12)]
    items = [slow, *ordinary[:4], slow, *ordinary[4:8], slow, *ordinary[8:]]

    async def scenario():
        service.verify_batcher.start()
        start = time.monotonic()

        async def one(item):
            outcome = await service.verify_batcher.submit(item)
            return outcome.verdict.value, time.monotonic() - start
        try:
            return await asyncio.gather(*(one(item) for item in items))
        finally:
            await service.verify_batcher.stop()

    try:
        answered = asyncio.run(scenario())
    finally:
        for verifier in service.verifier_pools:
            verifier.close()
    slow_ones = [answer for item, answer in zip(items, answered) if item is slow]
    ordinary_ones = [answer for item, answer in zip(items, answered) if item is not slow]
    assert [verdict for verdict, _ in ordinary_ones] == ["correct"] * 12
    assert [verdict for verdict, _ in slow_ones] == ["timeout"] * 3  # paid the RM's reward, not verified
    assert max(seconds for _, seconds in ordinary_ones) < min(seconds for _, seconds in slow_ones)
    assert max(seconds for _, seconds in slow_ones) < 5.0 + 1.0  # each by its own deadline, not one after another


def test_a_flood_of_slow_answers_is_answered_by_the_per_sample_deadline(serve):
    """24 answers of ~2 s each: lane after lane of them once took ~24 s; each is now answered by its own deadline
    (2.5 s), paid the RM's reward, not verified."""
    server = serve("--verify-deadline-s", "2.5")
    slow = [server.body(f"What is {k}?", "9", TOWER) for k in range(24)]
    answers = asyncio.run(_timed_posts(server.url + "/get_reward", slow))
    print(f"24 slow answers: the last answered after {max(seconds for _, _, seconds in answers):.1f} s")
    assert [status for status, _, _ in answers] == [200] * 24
    assert all(a["extra_logs"]["cooper/rule_correct"] == [0.0] and 0 < a["rewards"][0] < 1 for _, a, _ in answers)
    assert max(seconds for _, _, seconds in answers) < 12.0  # lane after lane of them: 24 x ~2 s / 2 lanes
    # and the verifier is free again: an ordinary answer right after is verified
    after = server.post(server.body("What is 2 + 3?", "5", "The answer is 5."))
    assert after.json()["extra_logs"]["cooper/rule_correct"] == [1.0]
