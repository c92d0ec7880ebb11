"""End to end: the reward service (`cli.serve --learn`, a real process) behind real clients and faults.

- Stock OpenRLHF: `python -m openrlhf.cli.train_ppo_ray ... --reward.remote_url http://.../get_reward?token=...`,
  nothing of OpenRLHF patched (`cli.stock_openrlhf` only starts Ray with the CPU runtime), 3 GRPO steps of the
  answering tiny policy (tests/test_cooper_e2e.py says why it answers), 4 prompts x 4 samples a step; once
  synchronous, once with `--train.async_enable`. The service learns: pairs are built from the groups' own
  rollouts, the RM version rises, every sample got a real reward, and (synchronous) each step is scored by the RM
  updated on the step before.
- kill -9 while an update runs, restart: the version and the counters continue from the last checkpoint.
- SIGTERM: a last checkpoint and the trained RM exported in the VerifyRM format, loadable by `rm.model.load_rm`.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.slow

TOKEN = "e2e-token-0123456789abcdef"
N, PROMPTS_PER_STEP, STEPS = 4, 4, 3
STOCK_N = 8  # the stock runs' n_samples_per_prompt (the GRPO group size most recipes use)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServiceProcess:
    """`cli.serve --learn` in its own process. `launcher`: the command before the flags (another entry point that
    runs cli.serve, e.g. tests/serve_pausing_save.py); `env`: extra environment variables."""

    def __init__(self, work: Path, rm: str, policy: str, *extra: str, port: int | None = None,
                 launcher: list[str] | None = None, env: dict | None = None):
        self.work, self.port = work, port or free_port()
        work.mkdir(parents=True, exist_ok=True)
        (work / "token").write_text(TOKEN)
        self.url = f"http://127.0.0.1:{self.port}"
        launcher = launcher or [sys.executable, "-m", "cooper_openrlhf.cli.serve"]
        argv = [*launcher, "--rm", rm, "--policy", policy,
                "--port", str(self.port), "--token-file", str(work / "token"), "--group-size", str(N),
                "--groups-per-update", str(PROMPTS_PER_STEP), "--learn", "--state-dir", str(work / "state"),
                "--rm-lr", "1e-3", "--rm-max-length", "256", *extra]
        self.log = open(work / "serve.log", "a")
        # Its own session: a test that fails leaves no service (nor its verifier pools) behind.
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError("the service exited: " + (work / "serve.log").read_text()[-4000:])
            try:
                if requests.get(self.url + "/health", headers=self.auth, timeout=2).ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        self.kill_all()
        raise AssertionError("the service did not come up: " + (work / "serve.log").read_text()[-4000:])

    def kill_all(self) -> None:
        """SIGKILL the service and everything it started."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(30)

    auth = {"Authorization": f"Bearer {TOKEN}"}

    def health(self) -> dict:
        return requests.get(self.url + "/health", headers=self.auth, timeout=10).json()

    def steps(self) -> list[dict]:
        path = self.work / "state" / "logs" / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def stop(self, sig=signal.SIGTERM) -> int:
        self.process.send_signal(sig)
        code = self.process.wait(60)
        try:  # what a killed service leaves (its verifier pools' processes)
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()
        return code


def _stock_openrlhf(work: Path, policy: Path, prompts: Path, url: str, *extra: str,
                    extra_env: dict | None = None, n: int = STOCK_N, must_succeed: bool = True) -> int:
    """Stock `train_ppo_ray` against `url`, n samples per prompt; its exit code."""
    argv, env = _stock_command(work, policy, prompts, url, *extra, extra_env=extra_env, n=n)
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    (work / "openrlhf.log").write_text(result.stdout + result.stderr)
    if must_succeed:
        assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    return result.returncode


def _stock_command(work: Path, policy: Path, prompts: Path, url: str, *extra: str, extra_env: dict | None = None,
                   n: int = STOCK_N) -> tuple[list[str], dict]:
    """(argv, environment) of a stock `train_ppo_ray` run against `url`."""
    argv = [sys.executable, "-m", "cooper_openrlhf.cli.stock_openrlhf",
            "--actor.model_name_or_path", str(policy), "--reward.remote_url", url,
            "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
            "--data.apply_chat_template", "--data.max_len", "1024",
            "--rollout.max_new_tokens", "16", "--rollout.n_samples_per_prompt", str(n),
            "--rollout.batch_size", str(PROMPTS_PER_STEP), "--rollout.micro_batch_size", "4",
            "--train.batch_size", str(PROMPTS_PER_STEP * n), "--train.micro_batch_size", "4",
            "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
            "--vllm.num_engines", "1", "--vllm.sync_backend", "gloo", "--vllm.enforce_eager",
            "--vllm.gpu_memory_utilization", "0.1", "--ds.attn_implementation", "eager", "--ds.zero_stage", "2",
            "--actor.num_gpus_per_node", "1", "--actor.adam.lr", "1e-4", "--actor.lr_warmup_ratio", "0",
            "--train.seed", "0", "--logger.tensorboard_dir", str(work / "tb"), "--ckpt.output_dir", str(work / "out"),
            "--ckpt.path", str(work / "ckpt"),  # an eval run saves its best checkpoint there
            *extra]
    env = {"HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    return argv, {**os.environ, **env, **(extra_env or {})}


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (a trainer started with start_new_session: its Ray cluster too)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # the session id, after state, ppid and pgrp
            try:
                os.kill(int(stat.parent.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def prompts(tmp_path_factory, answering_policy) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("serve_e2e")
    policy, rows = answering_policy
    (root / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return policy, root / "prompts.jsonl"


@pytest.fixture(scope="module")
def heldout(prompts) -> Path:
    """Two arithmetic prompts the training file does not hold, for OpenRLHF's --eval.dataset."""
    from cooper_openrlhf.data.synthetic import make_arithmetic_problems

    seen = {json.loads(line)["input"] for line in prompts[1].read_text().splitlines()}
    rows = [{"input": p.question, "label": p.reference} for p in make_arithmetic_problems(40, seed=7, max_operand=20)
            if p.question not in seen][:2]
    path = prompts[1].parent / "heldout.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# A CPU without bf16 units, on any machine: `auto` resolves to fp32 there, and a parent process that resolved it (a
# cooper run's start-up, or an earlier test in this process) leaves fp32 announced for the engines, while stock
# OpenRLHF trains in bf16. The weight sync must still agree (it once failed here at the first sync).
CPU_WITHOUT_BF16 = {"COOPER_CPU_BF16": "0", "COOPER_OPENRLHF_DTYPE": "fp32"}


# Nightly for the async trainer: the stock trainer against the learning service runs in CI synchronously, and
# test_scoring_goes_on_while_the_rm_learns holds --no-wait-for-update's scoring during an update.
@pytest.mark.parametrize("async_training", [False, pytest.param(True, marks=pytest.mark.nightly)],
                         ids=["sync-cpu-without-bf16", "async"])
def test_stock_openrlhf_trains_against_the_learning_service(prompts, heldout, model_dir, tmp_path, async_training):
    policy, prompt_file = prompts
    service = ServiceProcess(tmp_path / "service", model_dir("tiny-qwen2-rm"), str(policy), "--group-size",
                             str(STOCK_N), "--heldout-prompts", str(heldout),
                             *(["--no-wait-for-update"] if async_training else []))
    try:
        # OpenRLHF's eval rollouts (2 samples per held-out prompt, n is 4 in training) reach the same URL.
        extra = ["--eval.dataset", str(heldout), "--eval.steps", "1", "--eval.n_samples_per_prompt", "2",
                 *(["--train.async_enable"] if async_training else [])]
        _stock_openrlhf(tmp_path / "run", policy, prompt_file, f"{service.url}/get_reward?token={TOKEN}", *extra,
                        extra_env=None if async_training else CPU_WITHOUT_BF16)
        deadline = time.monotonic() + 60
        while len(service.steps()) < STEPS and time.monotonic() < deadline:
            time.sleep(0.5)
        health = service.health()
    finally:
        code = service.stop()
    steps = service.steps()
    # Every one of the 3 x 4 x 4 samples was scored and answered (none lost, none failed: OpenRLHF would have
    # stopped on a missing reward); every group completed, none expired.
    trained = health["samples"] - health["heldout_samples"]
    assert trained == STEPS * PROMPTS_PER_STEP * STOCK_N and health["groups_completed"] == STEPS * PROMPTS_PER_STEP
    assert health["groups_expired"] == 0 and len(steps) == STEPS and health["open_groups"] == 0
    # How busy the RM and the verifier were (what a user reads to tell which one bounds the service).
    assert health["rm_busy_seconds"] > 0 and health["verify_busy_seconds"] > 0
    # The eval prompts were paid and never grouped: no group was learned from them, and no check was broken.
    assert health["heldout_samples"] >= 2 * 2 and health["groups"] == "ok"
    # The service learned from the groups' own rollouts: pairs built, the RM moved, versions published.
    assert sum(r.get("cooper/rm_valid_pairs", 0) for r in steps) > 0
    assert health["updates"] >= 1 and health["rm_version"] == health["updates"]
    assert all(r["cooper/pairs_from_rollout"] in (0.0, 1.0) for r in steps)
    if not async_training:
        # The paper's timing: step t+1 is scored by the RM updated on step t, every group of it.
        for before, after in zip(steps, steps[1:]):
            assert after["cooper/scored_version_min"] == after["cooper/scored_version_max"] == before[
                "cooper/rm_version_after"]
    assert code == 0 and (service.work / "state" / "final_rm" / "config.json").is_file()
    tb = list((tmp_path / "run" / "tb").rglob("events.out.tfevents.*"))
    assert tb, "OpenRLHF logged nothing"


def test_stock_openrlhf_goes_through_a_real_runs_events_with_every_sample_paid(prompts, model_dir, tmp_path):
    """The events of a real run, none of which may cost it: a trainer killed mid-step and started again, two
    episodes of 10 prompts at 4 a step (each episode's last step is partial; OpenRLHF trains it), steps longer than
    a shortened --group-timeout-s (a CPU step here takes a minute or more), and one request sent by hand during the
    run. The run that is not killed finishes (a single unpaid sample would crash it), the killed run's partial
    groups are dropped rather than mixed with the new run's samples, and the service learns on."""
    from transformers import AutoTokenizer

    policy, prompt_file = prompts
    ten = tmp_path / "ten.jsonl"
    ten.write_text("".join(prompt_file.read_text().splitlines(keepends=True)[:10]))
    service = ServiceProcess(tmp_path / "service", model_dir("tiny-qwen2-rm"), str(policy), "--group-size",
                             str(STOCK_N), "--stale-after-s", "30",  # a CPU trainer restarts in a minute or more
                             "--group-timeout-s", "20")  # a group times out from its last sample, not its step's start
    url = f"{service.url}/get_reward?token={TOKEN}"
    by_hand = []
    try:
        # the first trainer, killed -9 in its second step (a few samples in: its groups are partial)
        argv, env = _stock_command(tmp_path / "killed", policy, ten, url, "--train.num_episodes", "2")
        (tmp_path / "killed").mkdir()
        with open(tmp_path / "killed" / "openrlhf.log", "w") as log:
            killed = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + 600
            while service.health()["samples"] < PROMPTS_PER_STEP * STOCK_N + 5 and time.monotonic() < deadline:
                assert killed.poll() is None, (tmp_path / "killed" / "openrlhf.log").read_text()[-3000:]
                time.sleep(0.05)
            _kill_session(killed.pid)
            killed.wait(60)
        time.sleep(5)  # what the killed run completed forms its (partial) step once it is quiet
        before = service.health()

        def send_by_hand():  # once the new run is scoring: one sample of a prompt the trainer never sends
            while service.health()["samples"] < before["samples"] + 8:
                time.sleep(0.2)
            prompt = AutoTokenizer.from_pretrained(policy).apply_chat_template(
                [{"role": "user", "content": "What is 2 + 2?"}], tokenize=False, add_generation_prompt=True)
            body = {"query": [prompt + "The answer is 4.<|im_end|>"], "prompts": [prompt], "labels": ["4"]}
            by_hand.append(requests.post(url, json=body, timeout=60).status_code)

        hand = threading.Thread(target=send_by_hand, daemon=True)
        hand.start()
        _stock_openrlhf(tmp_path / "run", policy, ten, url, "--train.num_episodes", "2")
        hand.join(30)
        time.sleep(35)  # the last partial step forms its step once the trainer is quiet (--partial-round-after-s)
        health = service.health()
    finally:
        code = service.stop()
    assert before["rounds"] >= 1 and by_hand == [200]
    # the killed run's partial groups (if the kill found any open) were dropped when the new run's first sample came
    # after the silence, never joined by the new run's samples; every one of the new run's 20 groups (steps of 4, 4
    # and 2 prompts an episode) was learned from, none left out as split when the next episode re-sent a prompt of
    # the partial step (a step here is quicker than STEP_GAP_S, so a partial step whose prompts the next step does
    # not re-send shares its step with that step's first groups: 5 or 6 steps)
    # (here they may time out first: --group-timeout-s is shorter than the trainer's restart)
    killed_partial = health["groups_dropped_silence"] + health["groups_dropped_timeout"]
    assert killed_partial >= before["open_groups"] and health["round_failures"] == 0
    assert health["groups_completed"] - before["groups_completed"] == 20
    killed_runs_last = 1 if before["ready_groups"] else 0  # the killed run's complete groups short of a step
    assert 5 <= health["rounds"] - before["rounds"] - killed_runs_last <= 6
    assert health["groups_dropped_split_trainer_group"] == 0 and health["ready_groups"] == 0
    assert health["updates"] >= before["updates"] + 2 and health["learning"] == "ok"
    assert code == 0


def _send_step(service: ServiceProcess, tokenizer, step_index: int) -> list[dict]:
    """One step of groups as OpenRLHF sends them (one sample per request), right and wrong answers mixed."""
    out = []
    for p in range(PROMPTS_PER_STEP):
        a, b = step_index + p + 2, p + 3
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], tokenize=False,
                                               add_generation_prompt=True)
        for k in range(N):
            answer = a + b + (k % 2)  # two right, two wrong per group
            body = {"query": [prompt + f"The answer is {answer}.<|im_end|>"], "prompts": [prompt], "labels": [str(a + b)]}
            response = requests.post(service.url + "/get_reward", json=body, headers=service.auth, timeout=60)
            assert response.status_code == 200, response.text
            out.append(response.json())
    return out


def test_kill_during_an_update_and_restart_continues_from_the_last_checkpoint(model_dir, tmp_path):
    from transformers import AutoTokenizer

    policy = model_dir("tiny-qwen2-policy")
    tokenizer = AutoTokenizer.from_pretrained(policy)
    slow = ("--rm-updates-per-round", "200")  # an update long enough to be killed in the middle of
    service = ServiceProcess(tmp_path, model_dir("tiny-qwen2-rm"), policy, *slow)
    _send_step(service, tokenizer, 0)
    deadline = time.monotonic() + 120
    while service.health()["updates"] < 1 and time.monotonic() < deadline:  # update 1 done and checkpointed
        time.sleep(0.2)
    saved = service.health()
    assert saved["updates"] == 1 and saved["rm_version"] == 1
    _send_step(service, tokenizer, 1)
    while not service.health()["update_in_flight"]:
        time.sleep(0.05)
    assert service.stop(signal.SIGKILL) == -signal.SIGKILL  # killed in the middle of update 2

    restarted = ServiceProcess(tmp_path, model_dir("tiny-qwen2-rm"), policy, *slow, port=service.port)
    try:
        resumed = restarted.health()
        # Update 2 was lost with the kill; everything up to the last checkpoint is back, the counter continues.
        assert resumed["rm_version"] == 1 and resumed["updates"] == 1 and resumed["rounds"] == 1
        assert resumed["samples"] == saved["samples"]
        answers = _send_step(restarted, tokenizer, 2)
        assert {a["extra_logs"]["cooper/rm_version"][0] for a in answers} == {1.0}
        deadline = time.monotonic() + 120
        while restarted.health()["rm_version"] < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert restarted.health()["rm_version"] == 2
    finally:
        assert restarted.stop() == 0
    from cooper_openrlhf.rm.model import load_rm

    model, _, version = load_rm(str(tmp_path / "state" / "final_rm"))
    assert version == "verifyrm-v1" and model.config.num_labels == 1


def test_the_service_pays_train_coopers_static_arm_rollouts_what_the_in_process_rm_paid(prompts, model_dir, tmp_path):
    """The package's own static arm (frozen RM inside the trainer) for 2 steps; its logged rollouts, sent to the
    service as OpenRLHF would send them (the policy's chat template, query = prompt + completion), are paid the same
    rewards as the in-process RM paid them, to float tolerance (same RM, same dtype, other batches)."""
    from test_cooper_e2e import _launch
    from test_serve_http import RunningService
    from transformers import AutoTokenizer

    policy, prompt_file = prompts
    work = tmp_path / "static"
    work.mkdir()
    (tmp_path / "prompts.jsonl").write_text(prompt_file.read_text())
    _launch(work, policy, model_dir("tiny-qwen2-rm"), trainable=False)
    rows = [json.loads(line) for path in sorted((work / "samples").glob("rollouts*.jsonl"))
            for line in path.read_text().splitlines()]
    assert len(rows) >= 16 and all(row["reward"] is not None for row in rows)
    service = RunningService(model_dir, tmp_path / "svc", group_size=4)
    try:
        tokenizer = AutoTokenizer.from_pretrained(policy)
        bodies = []
        for row in rows:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": row["question"]}], tokenize=False,
                                                   add_generation_prompt=True)
            bodies.append({"query": [prompt + row["completion"] + tokenizer.eos_token], "prompts": [prompt],
                           "labels": [row["reference"]]})
        paid = [requests.post(service.url + "/get_reward", json=body, timeout=60).json()["rewards"][0]
                for body in bodies]
    finally:
        service.stop()
    assert paid == pytest.approx([row["reward"] for row in rows], abs=2e-2)


@pytest.fixture
def vllm_server(prompts, tmp_path):
    """`vllm serve` (vLLM's own OpenAI-compatible server, the CPU build) of the answering policy: the assistant."""
    policy, _ = prompts
    port = free_port()
    log = open(tmp_path / "vllm.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(policy), "--served-model-name",
         "assistant", "--port", str(port), "--dtype", "auto", "--max-model-len", "512", "--enforce-eager"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "vllm.log").read_text()[-3000:]
            try:
                if requests.get(url + "/models", timeout=2).ok:
                    break
            except requests.ConnectionError:
                time.sleep(1)
        yield url
    finally:
        process.terminate()
        process.wait(60)
        log.close()


def test_assistant_rewrites_through_an_openai_endpoint_become_negatives(prompts, model_dir, tmp_path, vllm_server):
    """--negative-source assistant: the service asks `vllm serve` to rewrite each group's positive, keeps the
    rewrites the verifier proves wrong, and trains on them (the paper's negatives, with no engine of its own)."""
    from transformers import AutoTokenizer

    from cooper_openrlhf.engines.base import SamplingConfig
    from cooper_openrlhf.engines.openai_api import OpenAIChatEngine

    replies = OpenAIChatEngine(vllm_server, "assistant").generate(
        ["What is 2 + 3?", [{"role": "user", "content": "What is 4 + 4?"}]], SamplingConfig(8, 1.0, n=3, seed=1))
    assert len(replies) == 6 and all(isinstance(r, str) for r in replies)

    policy, _ = prompts
    tokenizer = AutoTokenizer.from_pretrained(policy)
    service = ServiceProcess(tmp_path / "svc", model_dir("tiny-qwen2-rm"), str(policy), "--negative-source",
                             "assistant", "--assistant-url", vllm_server, "--assistant-model", "assistant",
                             "--negative-max-new-tokens", "16")
    try:
        for step_index in range(2):
            _send_step(service, tokenizer, step_index)
        deadline = time.monotonic() + 120
        while len(service.steps()) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        service.stop()
    steps = service.steps()
    assert sum(r["cooper/negative_attempts"] for r in steps) >= 2 * PROMPTS_PER_STEP  # every positive was sent
    assert all(r["cooper/pairs_from_rollout"] == 0.0 for r in steps)
    assert sum(r.get("cooper/rm_valid_pairs", 0) for r in steps) > 0  # some rewrites proved wrong, trained on


def test_scoring_goes_on_while_the_rm_learns(model_dir, tmp_path):
    """Requests keep arriving while updates run (--no-wait-for-update, a step per group, long updates): scoring
    and learning happen at once in two threads and every request is answered. (The two once shared one fast
    tokenizer, which fails with "Already borrowed" when two threads use it at the same moment; the throughput
    benchmark hit it, this test rarely does on the tiny RM.)"""
    import asyncio

    import aiohttp
    from transformers import AutoTokenizer

    policy = model_dir("tiny-qwen2-policy")
    tokenizer = AutoTokenizer.from_pretrained(policy)
    # 48 prompts at once against steps of one group is no trainer's step (the group check would refuse it): this
    # test is about two threads, not the trainer's shape.
    service = ServiceProcess(tmp_path, model_dir("tiny-qwen2-rm"), policy, "--no-wait-for-update",
                             "--groups-per-update", "1", "--checkpoint-every", "0", "--rm-updates-per-round", "20",
                             "--no-group-check")
    bodies = []
    for p in range(48):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"What is {p} + 7?"}], tokenize=False,
                                               add_generation_prompt=True)
        bodies += [{"query": [prompt + f"The answer is {p + 7 + k % 2}.<|im_end|>"], "prompts": [prompt],
                    "labels": [str(p + 7)]} for k in range(N)]

    async def post_all():
        async with aiohttp.ClientSession(headers=service.auth) as session:
            async def one(body):
                async with session.post(service.url + "/get_reward", json=body) as response:
                    return response.status
            return await asyncio.gather(*(one(b) for b in bodies))

    try:
        statuses = asyncio.run(post_all())
        deadline = time.monotonic() + 120
        while service.health()["rounds"] < 48 and time.monotonic() < deadline:
            time.sleep(0.2)
        health = service.health()
    finally:
        service.stop()
    assert statuses == [200] * len(bodies)
    assert health["updates"] >= 1 and health["rm_version"] == health["updates"]
