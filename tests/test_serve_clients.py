"""The reward service's clients against the real service over HTTP: the retrying HTTP client (never a made-up
reward), verl's custom reward function loaded the way verl loads it, and TRL's GRPOTrainer training with it."""

import importlib.util
import socket
import sys
import threading
import time

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
    """`raw_service` with rounds of one group (the hacking monitor reads them), so that groups are kept: without
    rounds or learning the service keeps none."""
    running = RunningService(model_dir, tmp_path, token=TOKEN, chat_template=False, group_size=4, groups_per_update=1)
    yield running
    running.stop()


def _expected(service, questions, references, completions) -> list[float]:
    return torch.sigmoid(torch.tensor(service.direct_logits(list(zip(questions, references, completions))))).tolist()


def test_client_pays_the_services_reward_and_refuses_a_wrong_token(raw_service, monkeypatch):
    from cooper_openrlhf.clients.http import RewardClient, RewardServiceError

    monkeypatch.setenv("COOPER_REWARD_TOKEN", TOKEN)
    client = RewardClient(raw_service.url + "/get_reward")
    scores = client.score(["What is 2 + 3? The answer is 5."], ["What is 2 + 3?"], [5])
    assert scores.rewards == pytest.approx(_expected(raw_service, ["What is 2 + 3?"], ["5"], [" The answer is 5."]),
                                           abs=1e-5)
    assert scores.extra_logs["cooper/rule_correct"] == [1.0]
    with pytest.raises(RewardServiceError, match="HTTP 401"):
        RewardClient(raw_service.url + "/get_reward", token="wrong-token-000000", retries=3).score(["a"], ["a"], ["1"])


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


def test_client_retries_what_a_retry_can_fix_and_never_invents_a_reward():
    from cooper_openrlhf.clients.http import RewardClient, RewardServiceError

    server, url, calls = _stub([503, 504])
    try:
        assert RewardClient(url, retries=3, backoff_s=0.01).score(["q a"], ["q"], ["1"]).rewards == [0.75]
        assert len(calls) == 3
        calls.clear()
        server_down, down_url, down_calls = _stub([500] * 10)
        with pytest.raises(RewardServiceError, match="did not answer after 3 attempts"):
            RewardClient(down_url, retries=2, backoff_s=0.01).score(["q a"], ["q"], ["1"])
        server_down.should_exit = True
    finally:
        server.should_exit = True
    with pytest.raises(RewardServiceError, match="ConnectionError"):  # nothing listens: raises, no 0
        RewardClient("http://127.0.0.1:9/get_reward", retries=1, backoff_s=0.01).score(["q a"], ["q"], ["1"])


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


@pytest.mark.slow
def test_trl_grpo_trains_with_the_service_reward(monitored_service, model_dir, tmp_path, monkeypatch):
    """TRL's own GRPOTrainer, 2 steps on CPU with the tiny policy; every completion paid by the service."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from cooper_openrlhf.clients.trl import service_reward

    monkeypatch.setenv("COOPER_REWARD_TOKEN", TOKEN)
    policy = model_dir("tiny-qwen2-policy")
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)}
            for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]
    config = GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=8, max_steps=2, learning_rate=1e-4, logging_steps=1, report_to=[],
                        use_cpu=True, bf16=False, save_strategy="no", seed=0)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = GRPOTrainer(model=model, processing_class=AutoTokenizer.from_pretrained(policy),
                          reward_funcs=[service_reward(monitored_service.url + "/get_reward")], args=config,
                          train_dataset=Dataset.from_list(rows))
    trainer.train()
    assert monitored_service.service.counters["samples"] == 2 * 4  # 2 steps x 4 completions, every one scored
    assert monitored_service.service.groups.completed == 2  # TRL's 4 generations of a prompt formed one group
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert len(logged) == 2 and all(0 < entry["reward"] < 1 for entry in logged)  # the RM's probabilities
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
