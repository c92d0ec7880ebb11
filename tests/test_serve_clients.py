"""The reward service's clients against the real service over HTTP: the retrying HTTP clients, sync and async (never
a made-up reward), verl's custom reward function loaded the way verl loads it and run by verl 0.9.1's own reward
managers (in the verl venv of scripts/verl_venv.sh), and TRL's GRPOTrainer training with the sync and async reward
functions."""

import asyncio
import importlib.util
import inspect
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from test_serve_http import TOKEN, RunningService


@pytest.fixture
def raw_service(model_dir, tmp_path):
    """The service as TRL and verl reach it: raw questions (--no-chat-template), a token."""
    running = RunningService(model_dir, tmp_path, token=TOKEN, chat_template=False, group_size=4)
    yield running
    running.stop()


@pytest.fixture
def monitored_service(model_dir, tmp_path):
    """`raw_service` with steps of one group (the hacking monitor reads them), so that groups are kept: without
    steps or learning the service keeps none."""
    running = RunningService(model_dir, tmp_path, token=TOKEN, chat_template=False, group_size=4, groups_per_update=1)
    yield running
    running.stop()


def _expected(service, questions, references, completions) -> list[float]:
    return torch.sigmoid(torch.tensor(service.direct_logits(list(zip(questions, references, completions))))).tolist()


def _scorer(kind: str):
    """`score(url, queries, prompts, labels, **client_kwargs)` with the sync client, or the async one run to its end:
    both must keep the same contract."""
    from cooper_openrlhf.clients.async_http import AsyncRewardClient
    from cooper_openrlhf.clients.http import RewardClient

    if kind == "sync":
        return lambda url, *samples, **kwargs: RewardClient(url, **kwargs).score(*samples)
    return lambda url, *samples, **kwargs: asyncio.run(AsyncRewardClient(url, **kwargs).score(*samples))


CLIENTS = pytest.mark.parametrize("kind", ["sync", "async"])


@CLIENTS
def test_client_pays_the_services_reward_and_refuses_a_wrong_token(kind, raw_service, monkeypatch):
    from cooper_openrlhf.clients.http import RewardServiceError

    score = _scorer(kind)
    monkeypatch.setenv("COOPER_REWARD_TOKEN", TOKEN)
    scores = score(raw_service.url + "/get_reward", ["What is 2 + 3? The answer is 5."], ["What is 2 + 3?"], [5])
    assert scores.rewards == pytest.approx(_expected(raw_service, ["What is 2 + 3?"], ["5"], [" The answer is 5."]),
                                           abs=1e-5)
    assert scores.extra_logs["cooper/rule_correct"] == [1.0]
    with pytest.raises(RewardServiceError, match="HTTP 401"):
        score(raw_service.url + "/get_reward", ["a"], ["a"], ["1"], token="wrong-token-000000", retries=3)


def _stub(statuses: list[int]):
    """A loopback HTTP endpoint answering the given statuses in turn, then 200 with one reward (a failing service)."""
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app, calls = FastAPI(), []

    @app.post("/get_reward")
    async def get_reward():
        calls.append(time.monotonic())
        status = statuses[len(calls) - 1] if len(calls) <= len(statuses) else 200
        body = {"rewards": [0.75], "scores": [0.75], "extra_logs": {}} if status == 200 else {"error": "busy"}
        return JSONResponse(body, status_code=status)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return server, f"http://127.0.0.1:{port}/get_reward", calls


@CLIENTS
def test_client_retries_what_a_retry_can_fix_and_never_invents_a_reward(kind):
    from cooper_openrlhf.clients.http import RewardServiceError

    score = _scorer(kind)
    servers = []
    try:
        server, url, calls = _stub([503, 504])
        servers.append(server)
        assert score(url, ["q a"], ["q"], ["1"], retries=3, backoff_s=0.01).rewards == [0.75]
        assert len(calls) == 3
        server, url, calls = _stub([500] * 10)
        servers.append(server)
        with pytest.raises(RewardServiceError, match="did not answer after 3 attempts"):
            score(url, ["q a"], ["q"], ["1"], retries=2, backoff_s=0.01)
        server, url, calls = _stub([400])
        servers.append(server)
        with pytest.raises(RewardServiceError, match="HTTP 400.*busy"):  # the request is wrong: no retry
            score(url, ["q a"], ["q"], ["1"], retries=3, backoff_s=0.01)
        assert len(calls) == 1
    finally:
        for server in servers:
            server.should_exit = True
    token = "svctoken" + "4" * 24  # a token in the URL (OpenRLHF's way) never reaches the error either
    with pytest.raises(RewardServiceError, match=r"after 2 attempts \(.*Connect") as raised:  # nothing listens: no 0
        score(f"http://127.0.0.1:9/get_reward?token={token}", ["q a"], ["q"], ["1"], retries=1, backoff_s=0.01)
    assert token not in str(raised.value) and "get_reward?token=***" in str(raised.value)


def _load_like_verl(name: str, reward_kwargs: dict):
    """verl's `get_custom_reward_fn` (verl/trainer/ppo/reward.py): the file by path, the named function, with
    `reward_kwargs` added to every call."""
    import cooper_openrlhf.clients.verl as shipped

    spec = importlib.util.spec_from_file_location("custom_module", shipped.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_module"] = module
    spec.loader.exec_module(module)
    raw_fn = getattr(module, name)
    return lambda *args, **kwargs: raw_fn(*args, **kwargs, **reward_kwargs)


def test_verl_custom_reward_function_loaded_as_verl_does(raw_service, monkeypatch):
    monkeypatch.setenv("COOPER_REWARD_TOKEN", TOKEN)
    kwargs = {"url": raw_service.url + "/get_reward"}
    one = _load_like_verl("compute_score", kwargs)
    result = one("openai/gsm8k", " The answer is 7.", "7", {"question": "What is 3 + 4?", "split": "train"})
    assert result["score"] == pytest.approx(_expected(raw_service, ["What is 3 + 4?"], ["7"], [" The answer is 7."])[0],
                                            abs=1e-5)
    assert result["cooper_rule_correct"] == 1.0
    batch = _load_like_verl("compute_score_batch", kwargs)
    questions = ["What is 1 + 1?"] * 4
    sols = [" The answer is 2.", " The answer is 3.", " #### 2", " no idea"]
    results = batch(["gsm8k"] * 4, sols, ["2"] * 4, [{"question": q} for q in questions])
    assert [r["score"] for r in results] == pytest.approx(_expected(raw_service, questions, ["2"] * 4, sols), abs=1e-5)
    assert [r["cooper_rule_correct"] for r in results] == [1.0, 0.0, 1.0, 0.0]
    with pytest.raises(KeyError, match="extra_info has no 'question'"):
        one("gsm8k", "x", "1", {"index": 3})


@pytest.mark.slow  # nightly for the async form: test_client_pays_the_services_reward_... holds it in CI
@pytest.mark.parametrize("form", ["sync", pytest.param("async", marks=pytest.mark.nightly)])
def test_trl_grpo_trains_with_the_service_reward(form, monitored_service, model_dir, tmp_path, monkeypatch):
    """TRL's own GRPOTrainer, 2 steps on CPU with the tiny policy; every completion paid by the service, through
    `service_reward` or its `async def` form."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import is_async_callable

    from cooper_openrlhf.clients.trl import async_service_reward, service_reward

    monkeypatch.setenv("COOPER_REWARD_TOKEN", TOKEN)
    reward = (service_reward if form == "sync" else async_service_reward)(monitored_service.url + "/get_reward")
    # TRL picks its path with `is_async_callable`: a coroutine function is awaited on the trainer's event-loop
    # thread; its synchronous path would get a coroutine object back and fail on `len()`. So with the async form,
    # a run in which the service scored every completion went through TRL's async path.
    assert is_async_callable(reward) == inspect.iscoroutinefunction(reward) == (form == "async")
    policy = model_dir("tiny-qwen2-policy")
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)}
            for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]
    config = GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=8, max_steps=2, learning_rate=1e-4, logging_steps=1, report_to=[],
                        use_cpu=True, bf16=False, save_strategy="no", seed=0)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = GRPOTrainer(model=model, processing_class=AutoTokenizer.from_pretrained(policy),
                          reward_funcs=[reward], args=config, train_dataset=Dataset.from_list(rows))
    trainer.train()
    assert monitored_service.service.counters["samples"] == 2 * 4  # 2 steps x 4 completions, every one scored
    assert monitored_service.service.groups.completed == 2  # TRL's 4 generations of a prompt formed one group
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert len(logged) == 2 and all(0 < entry["reward"] < 1 for entry in logged)  # the RM's probabilities
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


VERL_VENV = Path(os.environ.get("COOPER_VERL_VENV", Path.home() / ".cache" / "cooper_openrlhf" / "verl-venv"))
VERL_SCRIPT = Path(__file__).parent / "scripts" / "verl_reward_manager.py"


@pytest.fixture
def verl_python() -> Path:
    """The verl venv's python; skips (before the service starts) where the venv was never made."""
    python = VERL_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no verl venv at {VERL_VENV} (verl 0.9.1 needs transformers < 5.11, so it has its own venv): "
                    f"make it with `bash scripts/verl_venv.sh`")
    return python


@pytest.mark.slow
def test_verl_reward_managers_score_a_rollout_batch_through_the_service(verl_python, monitored_service, model_dir):
    """verl 0.9.1's own reward managers (its trainer's reward loop, and the legacy batch manager) score a rollout
    batch through clients/verl.py against the running service; verl runs in its own venv (transformers < 5.11)."""
    batches = {"loop": {"question": "What is 1 + 1?", "answer": "2",
                        "responses": [" The answer is 2.", " The answer is 3.", " #### 2", " no idea"]},
               "legacy": {"question": "What is 2 + 5?", "answer": "7",
                          "responses": [" The answer is 7.", " 8", " It is 7.", " The answer is 9."]}}
    env = {**os.environ, "COOPER_REWARD_TOKEN": TOKEN,  # the token from the environment, as a user would pass it
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}  # this checkout's clients
    done = subprocess.run([str(verl_python), str(VERL_SCRIPT), monitored_service.url + "/get_reward",
                           str(model_dir("tiny-qwen2-policy")), json.dumps(batches)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    scored = json.loads(done.stdout.strip().splitlines()[-1])
    assert scored["loop"]["manager"] == "verl.experimental.reward_loop.reward_manager.naive.NaiveRewardManager"
    assert scored["legacy"]["manager"] == "verl.workers.reward_manager.batch.BatchRewardManager"
    for path, spec in batches.items():
        n = len(spec["responses"])
        expected = _expected(monitored_service, [spec["question"]] * n, [spec["answer"]] * n, spec["responses"])
        rows, last = scored[path]["rewards"], scored[path]["last"]
        # the service's reward on each response's last token, nothing elsewhere: what verl's advantage reads
        assert [row[i] for row, i in zip(rows, last)] == pytest.approx(expected, abs=1e-5)
        assert all(value == 0 for row, i in zip(rows, last) for j, value in enumerate(row) if j != i)
    assert [info["cooper_rule_correct"] for info in scored["loop"]["extra"]] == [1.0, 0.0, 1.0, 0.0]
    assert scored["legacy"]["extra"]["cooper_rule_correct"] == [1.0, 0.0, 1.0, 0.0]
    assert monitored_service.service.counters["samples"] == 8  # every sample paid once
    assert monitored_service.service.groups.completed == 2  # each prompt's 4 responses formed one group
