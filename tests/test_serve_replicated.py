"""The reward service on Ray Serve (`cli.serve --replicas N`) under the faults it is built for, on a local Ray
cluster of its own: the CLI is started as a process (the user's path), it starts the cluster, and everything it
started is stopped with it (SIGTERM, then SIGKILL by pid of what is left; never `ray stop`).

- Each scoring replica killed -9 in turn in the middle of a stream of single-sample POSTs (aiohttp, OpenRLHF's body, one try
  each: stricter than OpenRLHF's client, which would try 5 times): every request 200 with the RM's own score, the
  ingress retried the killed replica's calls, and Serve put a new replica in its place.
- The learner killed -9 in the middle of an update: scoring goes on with the last published version meanwhile
  (200s, that version in `cooper/rm_version`), the learner comes back from its checkpoint with its counters, the
  lost step is learned again, and the versions keep rising one by one.
- The group registry killed -9 in the middle of a step under load: every request 200 while Ray restarts it, the
  groups it held not learned from, no group mixing two prompts, the steps going on after.
- Stock `openrlhf.cli.train_ppo_ray` against 2 replicas + learner (the issue's target), sync (over HTTPS, two
  ingress replicas) and async, with a scoring replica and then an ingress replica killed -9 (sync) or the learner
  (async) during the run: every sample paid (no reward None: the run completes), each trainer group scored by one
  version and complete (the dead ingress's places given back to the client's retries), the version rising.
"""

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import pytest
import requests

from test_serve_e2e import PROMPTS_PER_STEP, STEPS, STOCK_N, _stock_openrlhf, free_port
from test_serve_e2e import prompts  # noqa: F401  (the stock runs' prompt file: a module fixture)
from test_serve_load import Policy, rm_rewards
from test_serve_tls import _self_signed

pytestmark = pytest.mark.slow

TOKEN = "replicated-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class ReplicatedService:
    """`cli.serve --replicas N` in its own process group; `pids(title)`: its Ray workers by class (`ray::Title`)."""

    def __init__(self, work: Path, model_dir, *flags: str, replicas: int = 2, policy: str | None = None,
                 start_timeout_s: float = 420, tls: tuple[Path, Path] | None = None):
        work.mkdir(parents=True, exist_ok=True)
        (work / "token").write_text(TOKEN)
        self.work, self.port = work, free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.verify = str(tls[0]) if tls else True  # a self-signed certificate is its own authority
        if tls:
            flags = (*flags, "--ssl-certfile", str(tls[0]), "--ssl-keyfile", str(tls[1]))
        argv = [sys.executable, "-m", "cooper_openrlhf.cli.serve", "--rm", str(model_dir("tiny-qwen2-rm")),
                "--policy", policy or str(model_dir("tiny-qwen2-policy")), "--port", str(self.port),
                "--token-file", str(work / "token"), "--dtype", "fp32", "--replicas", str(replicas), *flags]
        self.log_path = work / "serve.log"
        self.log = open(self.log_path, "a")
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, "HF_HUB_OFFLINE": "1"})
        self.started: set[int] = set()
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError("the service exited: " + self.log_path.read_text()[-4000:])
            self._note_descendants()
            # The ingress answers /health as soon as it runs, while Serve may still be starting the scoring
            # replicas; a replica killed then fails the deployment (Serve counts it a failed start). Up means the
            # launcher's own line, written once `serve.run` returned.
            if "serving RM version" not in self.log_path.read_text(errors="replace"):
                time.sleep(1)
                continue
            try:
                if requests.get(self.url + "/health", headers=AUTH, timeout=5, verify=self.verify).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        self.kill_all()
        raise AssertionError("the service did not come up: " + self.log_path.read_text()[-4000:])

    def _note_descendants(self) -> list:
        import psutil

        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.started.update(child.pid for child in children)
        return children

    def pids(self, title: str) -> list[int]:
        """Live Ray workers of this service running `title` (a deployment's replicas: "ServeReplica:cooper-serve:
        Scorer"; the learner: "LearnerActor")."""
        import psutil

        found = []
        for child in self._note_descendants():
            try:
                if " ".join(child.cmdline()).startswith(f"ray::{title}") and child.status() != psutil.STATUS_ZOMBIE:
                    found.append(child.pid)
            except psutil.Error:
                continue
        return found

    def health(self) -> dict:
        return requests.get(self.url + "/health", headers=AUTH, timeout=60, verify=self.verify).json()

    def steps(self) -> list[dict]:
        path = self.work / "state" / "logs" / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def stop(self) -> int:
        """SIGTERM (the learner's last checkpoint, export, Ray down), then SIGKILL whatever it left."""
        self._note_descendants()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(180)
        except subprocess.TimeoutExpired:
            code = None
        self.kill_all()
        return code

    def kill_all(self) -> None:
        for pid in [*self.started, self.process.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()


async def post_all(url: str, bodies: list[dict], concurrency: int, on_answer=None) -> list[tuple[int, dict | str]]:
    """Each body POSTed once (no retry), `concurrency` in flight; (status, answer) in order."""
    answers: list = [None] * len(bodies)
    pending = list(range(len(bodies)))[::-1]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=180), headers=AUTH) as session:
        async def worker():
            while pending:
                i = pending.pop()
                async with session.post(url + "/get_reward", json=bodies[i]) as response:
                    text = await response.text()
                    answers[i] = (response.status, json.loads(text) if response.status == 200 else text)
                if on_answer is not None:
                    on_answer(sum(a is not None for a in answers))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers


def arithmetic_samples(policy: Policy, count: int, offset: int = 0, group_size: int = 1) -> list[tuple]:
    """(query, prompt, label) of `count` samples, `group_size` per prompt, answers right and wrong."""
    samples = []
    for k in range(count):
        group, member = divmod(k, group_size)
        a, b = 2 + (group + offset) % 89, 3 + (group + offset) // 89
        samples.append(policy.sample(f"What is {a} + {b}?", str(a + b), f"The answer is {a + b + member % 2}."))
    return samples


def as_body(sample: tuple) -> dict:
    query, prompt, label = sample
    return {"query": [query], "prompts": [prompt], "labels": [label]}


def test_scoring_replicas_killed_mid_stream_cost_no_request(model_dir, tmp_path):
    policy = Policy(model_dir)
    # Batches that wait 50 ms to fill keep both replicas busy with calls in flight, so a kill lands inside one.
    service = ReplicatedService(tmp_path, model_dir, "--max-batch", "16", "--max-wait-ms", "50")
    try:
        scorers = service.pids("ServeReplica:cooper-serve:Scorer")
        assert len(scorers) == 2, scorers
        samples = arithmetic_samples(policy, 600)
        killed = []

        def kill_each_original_replica_in_turn(answered: int) -> None:
            """The first at a sixth of the stream, the second at a half (the first's replacement serves by then)."""
            due = [len(samples) // 6, len(samples) // 2]
            if len(killed) < len(due) and answered >= due[len(killed)]:
                killed.append(scorers[len(killed)])
                os.kill(killed[-1], signal.SIGKILL)

        answers = asyncio.run(post_all(service.url, [as_body(s) for s in samples], 64,
                                       kill_each_original_replica_in_turn))
        health = service.health()
        deadline = time.monotonic() + 180
        while len(service.pids("ServeReplica:cooper-serve:Scorer")) < 2 and time.monotonic() < deadline:
            time.sleep(1)
        replaced = service.pids("ServeReplica:cooper-serve:Scorer")
    finally:
        service.stop()
    assert len(killed) == 2, "the stream ended before the kills"
    failed = [(i, a) for i, a in enumerate(answers) if a[0] != 200]
    assert not failed, failed[:5]
    # every reward is the RM's own score of that sample (scored in other batches: fp32 rounding only)
    own = rm_rewards(model_dir, [(question_from(policy, s[1]), s[2], completion_from(s)) for s in samples])
    got = [a[1]["rewards"][0] for a in answers]
    assert max(abs(g - e) for g, e in zip(got, own)) < 1e-4
    # the kill hit calls in flight, and the ingress sent them again; Serve replaced the replica
    assert health["scoring_retries"] >= 1 and health["samples"] == len(samples)
    assert len(replaced) == 2 and not set(killed) & set(replaced)


def question_from(policy: Policy, prompt: str) -> str:
    """The question `Policy.prompt` templated (the samples above are one user message each)."""
    marker = "What is "
    return prompt[prompt.index(marker): prompt.index("?", prompt.index(marker)) + 1]


def completion_from(sample: tuple) -> str:
    query, prompt, _ = sample
    return query[len(prompt):].replace("<|im_end|>", "")


LEARN = ("--learn", "--group-size", "4", "--groups-per-update", "4", "--rm-lr", "1e-3", "--rm-max-length", "256")


def learning_steps(policy: Policy, count: int) -> list[list[dict]]:
    """`count` steps of LEARN's shape (4 groups of 4 samples), each on prompts of its own."""
    return [[as_body(s) for s in arithmetic_samples(policy, 16, offset=4 * r, group_size=4)] for r in range(count)]


def first_step_learned(service: ReplicatedService, step: list[dict]) -> list:
    """The first step's answers, once the learner has updated on it."""
    answers = asyncio.run(post_all(service.url, step, 16))
    _wait_for("update 1", lambda: service.health()["updates"] >= 1)
    return answers


def _wait_for(what, condition, timeout_s: float = 300, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_learner_killed_mid_update_comes_back_from_its_checkpoint_while_scoring_goes_on(model_dir, tmp_path):
    """The learner killed -9 mid-update (module docstring). It also reads the probe suite (--probe-every 2) on the
    weights it trains, before and after its restart: steps 0 and 2 log what the RM pays each attack form, step 2
    what the exported final RM pays."""
    policy = Policy(model_dir)
    slow = ("--rm-updates-per-round", "200")  # an update long enough to be killed in the middle of
    probe_file = tmp_path / "probe_prompts.jsonl"
    probe_file.write_text("".join(json.dumps({"input": f"What is {a} + {b}?", "label": str(a + b)}) + "\n"
                                  for a, b in [(2, 3), (7, 4), (12, 9)]))
    probing = ("--probe-every", "2", "--probe-prompts", str(probe_file))
    service = ReplicatedService(tmp_path, model_dir, *LEARN, *slow, *probing, "--state-dir", str(tmp_path / "state"))
    steps = learning_steps(policy, 3)
    try:
        first = first_step_learned(service, steps[0])
        learner = service.pids("LearnerActor")
        assert len(learner) == 1, learner
        second = asyncio.run(post_all(service.url, steps[1], 16))
        _wait_for("update 2 in flight", lambda: service.health()["update_in_flight"], every_s=0.05)
        os.kill(learner[0], signal.SIGKILL)
        # the next step's samples while the learner is down: scored now, by the last published version
        third = asyncio.run(post_all(service.url, steps[2], 16))
        during = service.health()
        after = _wait_for("the lost step and the next one learned", lambda: (h := service.health())["updates"] >= 3
                          and not h["update_in_flight"] and h)
        restarted = service.pids("LearnerActor")
        metrics = requests.get(service.url + "/metrics", headers=AUTH, timeout=60, verify=service.verify).text
    finally:
        code = service.stop()
    answers = first + second + third
    assert all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:3]
    versions = [{a["extra_logs"]["cooper/rm_version"][0] for _, a in step} for step in (first, second, third)]
    assert versions == [{0.0}, {1.0}, {1.0}]  # the third step while update 2 was lost: the last published, 1
    assert during["learner_restarts"] == 1 and during["rm_version"] == 1
    assert len(restarted) == 1 and restarted != learner
    # the counters went on from the checkpoint (update 1): the lost step learned again as update 2, then step 2
    assert after["updates"] == 3 and after["rounds"] == 3 and after["rm_version"] == 3
    assert after["samples"] == 48 and after["groups_completed"] == 12 and after["round_failures"] == 0
    log = service.steps()
    assert [r["round"] for r in log] == [0, 1, 2]
    assert [r["cooper/rm_version_after"] for r in log] == [1, 2, 3]
    assert [(r["cooper/scored_version_min"], r["cooper/scored_version_max"]) for r in log] == [(0, 0), (1, 1),
                                                                                              (1, 1)]
    assert code == 0 and (tmp_path / "state" / "final_rm" / "config.json").is_file()
    # the probes: due at steps 0 and 2 only; step 2's read the weights the service ended with (version 3)
    from cooper_openrlhf.rm.scorer import RMScorer
    from cooper_openrlhf.serve.probing import ServiceProbe, problems_of

    assert ["cooper/probe_pay/exploit" in r for r in log] == [True, False, True]
    assert all(0 < r[f"cooper/probe_pay/{form}"] < 1 for r in (log[0], log[2]) for form in ("right", "wrong"))
    final_rm = RMScorer.load(str(tmp_path / "state" / "final_rm"))
    final = ServiceProbe(problems_of(str(probe_file)), every=2).read(final_rm)
    assert log[2]["cooper/probe_pay/exploit"] == pytest.approx(final["cooper/probe_pay/exploit"], abs=1e-4)
    assert log[2]["cooper/probe_premium/exploit"] == pytest.approx(final["cooper/probe_premium/exploit"], abs=1e-4)
    # the front's /metrics shows the last step's numbers, as one process does
    shown = {m.group(1): float(m.group(2)) for m in re.finditer(r'cooper_serve_round\{key="([^"]+)"\} (\S+)', metrics)}
    assert shown["cooper_rm_version_after"] == 3.0
    assert shown["cooper_probe_pay_exploit"] == pytest.approx(log[2]["cooper/probe_pay/exploit"], abs=1e-6)


def test_the_registry_killed_under_load_comes_back_while_scoring_and_learning_go_on(model_dir, tmp_path):
    """The group registry killed -9 in the middle of a step, with requests in flight and queued (registry.py): Ray
    starts it again, it starts itself from the learner, and the ingress sends its calls again meanwhile: every
    request 200, scored by the version the learner holds. The places reserved before the kill name groups of the
    dead incarnation, never one of the new one's (ids carry the incarnation), so no group ever holds two prompts:
    no step fails in pair building, and the steps go on."""
    policy = Policy(model_dir)
    service = ReplicatedService(tmp_path, model_dir, *LEARN, "--state-dir", str(tmp_path / "state"))
    steps = learning_steps(policy, 4)
    try:
        first = first_step_learned(service, steps[0])
        registry = service.pids("GroupRegistry")
        assert len(registry) == 1, registry

        def kill_after_six(answered: int) -> None:  # step 2: 6 answered, 4 in flight, 6 queued
            if answered == 6:
                os.kill(registry[0], signal.SIGKILL)

        second = asyncio.run(post_all(service.url, steps[1], 4, on_answer=kill_after_six))
        third = asyncio.run(post_all(service.url, steps[2], 16))
        _wait_for("update 2", lambda: service.health()["updates"] >= 2)
        fourth = asyncio.run(post_all(service.url, steps[3], 16))
        after = _wait_for("update 3", lambda: (h := service.health())["updates"] >= 3 and not h["update_in_flight"]
                          and h)
        restarted = service.pids("GroupRegistry")
    finally:
        code = service.stop()
    answers = first + second + third + fourth
    assert all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:3]
    versions = [sorted({a["extra_logs"]["cooper/rm_version"][0] for _, a in step})
                for step in (first, second, third, fourth)]
    assert versions[0] == [0.0] and versions[1] == [1.0] and min(versions[3]) >= 2.0
    assert after["registry_restarts"] == 1 and len(restarted) == 1 and restarted != registry
    # Groups open at the kill are not learned from (their samples were paid); every step after is whole.
    assert after["round_failures"] == 0 and after["learning"] == "ok" and after["rounds"] >= 3
    logged = service.steps()
    assert all(r["cooper/samples"] % 4 == 0 and r.get("cooper/rm_update_failed", 0.0) == 0.0 for r in logged)
    assert code == 0 and (tmp_path / "state" / "final_rm" / "config.json").is_file()


class KillDuringRun(threading.Thread):
    """Kills one of the service's workers once, the first time `due(health)` holds, while the trainer runs."""

    def __init__(self, service: ReplicatedService, title: str, due):
        super().__init__(daemon=True)
        self.service, self.title, self.due = service, title, due
        self.killed: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set() and self.killed is None:
            try:
                if self.due(self.service.health()):
                    pid = self.service.pids(self.title)[0]
                    os.kill(pid, signal.SIGKILL)
                    self.killed = pid
            except (requests.RequestException, IndexError):
                pass
            time.sleep(0.02)


# Two stock runs, each with a fault: the synchronous trainer while a scoring replica is killed, the asynchronous one
# while the learner is killed mid-update. (A run with no fault checks nothing these two do not, at 4-5 min a run.)
# Nightly for the learner's fault: test_the_learner_killed_mid_update_comes_back_... holds it with a direct client;
# the stock trainer against the replicated front runs in CI with the replica's.
@pytest.mark.parametrize("fault", ["replica", pytest.param("async_learner", marks=pytest.mark.nightly)])
def test_stock_openrlhf_trains_against_two_replicas_and_a_learner(prompts, model_dir, tmp_path, fault):
    """The issue's target: stock `train_ppo_ray --reward.remote_url` (the front's one URL), 3 GRPO steps of 4
    prompts x 8 samples, against 2 scoring replicas and the learner; `fault` kills a scoring replica while samples
    are in flight (sync trainer), or the learner while an update runs (`--train.async_enable`; the update made long
    enough to be caught: 50 passes)."""
    policy, prompt_file = prompts
    flags = ["--learn", "--group-size", str(STOCK_N), "--groups-per-update", str(PROMPTS_PER_STEP), "--rm-lr", "1e-3",
             "--rm-max-length", "256", "--state-dir", str(tmp_path / "service" / "state")]
    asynchronous = fault == "async_learner"
    if asynchronous:
        flags += ["--no-wait-for-update", "--rm-updates-per-round", "50"]
    else:
        flags += ["--ingress-replicas", "2"]
    # The synchronous run goes over HTTPS (Serve's proxy with --ssl-certfile/--ssl-keyfile), as a service reached
    # beyond one machine should: the trainer's client trusts the self-signed certificate through SSL_CERT_FILE.
    tls = _self_signed(tmp_path) if not asynchronous and shutil.which("openssl") else None
    service = ReplicatedService(tmp_path / "service", model_dir, *flags, policy=str(policy), tls=tls)
    if fault == "replica":
        killers = [KillDuringRun(service, "ServeReplica:cooper-serve:Scorer", lambda h: h["in_flight_samples"] > 0
                                 and h["samples"] >= PROMPTS_PER_STEP * STOCK_N),
                   # an ingress replica in step 3, with places reserved for the samples it was scoring: OpenRLHF's
                   # client tries those again 1 s later, through the other ingress
                   KillDuringRun(service, "ServeReplica:cooper-serve:Ingress", lambda h: h["in_flight_samples"] > 0
                                 and h["samples"] >= 2 * PROMPTS_PER_STEP * STOCK_N)]
    else:
        killers = [KillDuringRun(service, "LearnerActor", lambda h: h["update_in_flight"])]
    try:
        for killer in killers:
            killer.start()
        _stock_openrlhf(tmp_path / "run", policy, prompt_file, f"{service.url}/get_reward?token={TOKEN}",
                        *(["--train.async_enable"] if asynchronous else []),
                        extra_env={"SSL_CERT_FILE": str(tls[0])} if tls else None)
        health = _wait_for("every step learned", lambda: (h := service.health())["rounds"] >= STEPS
                           and not h["update_in_flight"] and h, timeout_s=420)
    finally:
        for killer in killers:
            killer.done.set()
        code = service.stop()
    steps = service.steps()
    # the run completed, so no sample's reward was None; every one of the 3 x 4 x 8 was paid and grouped. An ingress
    # killed after recording samples but before its 200s went out has them retried: answered again from the record,
    # counted in no group (`samples_retried`), so the answers beyond the steps' samples are exactly those.
    assert health["samples"] - health["samples_retried"] == STEPS * PROMPTS_PER_STEP * STOCK_N
    assert health["groups_completed"] == STEPS * PROMPTS_PER_STEP and health["groups_expired"] == 0
    assert health["groups"] == "ok" and health["round_failures"] == 0
    assert [r["round"] for r in steps] == list(range(STEPS))
    if not asynchronous:
        # each step's groups, scored on both replicas, by one version (min = max over the step); an async trainer
        # sends step t+1 while step t's update runs, so its groups may see two versions (each group one)
        assert all(r["cooper/scored_version_min"] == r["cooper/scored_version_max"] for r in steps), steps
    after = [r["cooper/rm_version_after"] for r in steps]
    assert after == sorted(after) and health["updates"] >= 1 and health["rm_version"] == health["updates"]
    if not asynchronous:  # the paper's timing: step t+1 scored by the RM updated on step t
        for before, later in zip(steps, steps[1:]):
            assert later["cooper/scored_version_min"] == before["cooper/rm_version_after"]
    assert all(killer.killed is not None for killer in killers), "the run ended before a kill"
    if asynchronous:
        assert health["learner_restarts"] == 1
    assert code == 0 and (tmp_path / "service" / "state" / "final_rm" / "config.json").is_file()
    if tls:
        assert f"at https://127.0.0.1:{service.port}/get_reward" in service.log_path.read_text(errors="replace")
