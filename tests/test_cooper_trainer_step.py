"""The middle layer: `CooperPPOTrainer.train_step`'s control flow, with fake actor handles and engines.

The trainer's own code and OpenRLHF's `train_step` / `ppo_train` / `broadcast_to_vllm` run unchanged; only
what sits behind Ray handles is faked (as OpenRLHF's own tests/test_ppo_trainer.py does): `ray` in the
modules that call it becomes a thread-backed stand-in in which each fake actor runs its calls in order
on its own thread, like a Ray actor. The pair actor is the real `PairBuilder` with the real verifier
pool; its assistant is a fake engine that can be slowed down. Every flag combination that the
validation accepts for the step's control flow is run; each fake records when its calls ran, so the
tests can check what overlaps what.
"""

import json
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch

from cooper_openrlhf.algo.negatives import NegativeConfig
from cooper_openrlhf.verify.pool import VerifierPool
from cooper_openrlhf.verify.rule import RuleVerifierConfig

N = 2  # rollouts per prompt
QUESTIONS = ["What is 1 + 1?", "What is 2 + 2?", "What is 3 + 3?"]
REFERENCES = ["2", "4", "6"]
# Prompt 0: right then wrong; prompt 1: right twice; prompt 2: no answer then wrong.
COMPLETIONS = ["1 + 1 = \\boxed{2}", "1 + 1 = \\boxed{3}", "2 + 2 = \\boxed{4}", "so \\boxed{4}",
               "I am not sure", "3 + 3 = \\boxed{7}"]
VERIFIED = [True, False, True, True, False, False]


# ------------------------------------------------------------------------------------------- fake Ray
class Events:
    """(name, start, end) of every fake call, in perf_counter seconds."""

    def __init__(self):
        self.lock = threading.Lock()
        self.spans: list[tuple[str, float, float]] = []

    def add(self, name, start, end):
        with self.lock:
            self.spans.append((name, start, end))

    def span(self, name, index=0):
        return [s for s in self.spans if s[0] == name][index][1:]

    def names(self):
        return [name for name, _, _ in sorted(self.spans, key=lambda s: s[1])]

    def count(self, name):
        return sum(s[0] == name for s in self.spans)


class FakeRay:
    ObjectRef = Future

    @staticmethod
    def get(refs, timeout=None):
        if isinstance(refs, list):
            return [FakeRay.get(ref) for ref in refs]
        return refs.result() if isinstance(refs, Future) else refs

    @staticmethod
    def put(value):
        done = Future()
        done.set_result(value)
        return done


class FakeActor:
    """Calls `obj.<method>.remote(...)` run on this actor's own thread, one at a time, in submission order."""

    def __init__(self, obj, name, events):
        self._obj, self._name, self._events = obj, name, events
        self._thread = ThreadPoolExecutor(max_workers=1)

    def __getattr__(self, method):
        def remote(*args, **kwargs):
            def run():
                start = time.perf_counter()
                try:
                    return getattr(self._obj, method)(*args, **kwargs)
                finally:
                    self._events.add(f"{self._name}.{method}", start, time.perf_counter())

            return self._thread.submit(run)

        return SimpleNamespace(remote=remote)


class FakeGroup:
    """What the trainer and OpenRLHF use of a RayActorGroup."""

    def __init__(self, actors):
        self._actor_handlers = actors

    def async_run_method(self, method_name, *args, **kwargs):
        return [getattr(actor, method_name).remote(*args, **kwargs) for actor in self._actor_handlers]

    def async_run_method_batch(self, method_name, **kwargs):
        return self.async_run_method(method_name, **kwargs)


class FakePolicy:
    def __init__(self, fit_seconds, ckpt_dir=None):
        self.fit_seconds = fit_seconds
        self.ckpt_dir = ckpt_dir  # {ckpt.path}/_actor

    def append(self, experience):
        return None

    def fit(self, kl_ctl):
        time.sleep(self.fit_seconds)
        return {"policy_loss": 0.1}

    def broadcast_to_vllm(self):
        return None

    def save_checkpoint(self, tag, client_states=None, **kwargs):
        self.saved = tag
        if self.ckpt_dir:
            deepspeed_save(self.ckpt_dir, tag, client_states)

    def get_checkpoint_states(self):
        """What the policy actor loaded at start-up (`latest`, as OpenRLHF's PolicyModelActor does)."""
        return deepspeed_load(self.ckpt_dir, None)

    def reload_states(self):
        return None

    def offload_states(self):
        return None


def deepspeed_save(folder, tag, client_states):
    """What DeepSpeed's save_checkpoint leaves on disk, as far as a resume reads it: the tag's client state, then
    `latest` naming the tag."""
    os.makedirs(os.path.join(folder, tag), exist_ok=True)
    with open(os.path.join(folder, tag, "client_states.json"), "w") as handle:
        json.dump(client_states or {}, handle)
    with open(os.path.join(folder, "latest"), "w") as handle:
        handle.write(tag)


def deepspeed_load(folder, tag):
    """DeepSpeed's load_checkpoint: `tag`, else what `latest` names; a missing tag loads nothing (None)."""
    if tag is None:
        with open(os.path.join(folder, "latest")) as handle:
            tag = handle.read().strip()
    path = os.path.join(folder, tag, "client_states.json")
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        return json.load(handle)


class FakeRM:
    """Scores a completion by whether it boxes the reference; each update makes every later score 0.5 higher."""

    def __init__(self, ckpt_dir=None):
        self.bias = 0.0
        self.fits = []
        self.ckpt_dir = ckpt_dir  # {ckpt.path}/_rm: checkpoints go to disk as DeepSpeed lays them out

    def score(self, questions, references, completions):
        return [(2.0 if f"\\boxed{{{r}}}" in c else -1.0) + self.bias for r, c in zip(references, completions)]

    def fit(self, pairs, global_valid):
        self.fits.append((pairs, global_valid))
        self.bias += 0.5
        return {"cooper/rm_updated": 1.0, "cooper/rm_valid_pairs": float(global_valid), "cooper/rm_loss": 0.5,
                "cooper/rm_fit_seconds": 0.01}

    def reload_states(self):
        return None

    def offload_states(self):
        return None

    def empty_cache(self):
        return None

    def save_checkpoint(self, tag, client_states=None):
        self.saved = getattr(self, "saved", []) + [tag]
        if self.ckpt_dir:
            deepspeed_save(self.ckpt_dir, tag, client_states)

    def load_checkpoint(self, tag=None):
        states = deepspeed_load(self.ckpt_dir, tag)
        if states is None:  # as TrainableRewardModelActor.load_checkpoint
            raise FileNotFoundError(f"no reward-model checkpoint {tag} under {self.ckpt_dir}")
        self.loaded = tag
        return states

    def keep_policy_tags(self):
        return []


class FakeEngine:
    """A vLLM engine's sleep API (the rollouts are made before the step)."""

    def wake_up(self, tags=None):
        return None

    def sleep(self, level=1):
        return None


class SlowAssistant:
    """Rewrites a solution by bumping its boxed answer, after `seconds` (the engine boundary)."""

    def __init__(self, seconds, events):
        self.seconds, self.events = seconds, events

    def generate(self, prompts, sampling):
        start = time.perf_counter()
        time.sleep(self.seconds)
        replies = []
        for messages in prompts:
            solution = messages[-1]["content"].split("Correct solution:\n", 1)[1].split("\n\nRewrite", 1)[0]
            answer = solution.rsplit("\\boxed{", 1)[1].split("}", 1)[0]
            replies.append(solution.replace(f"\\boxed{{{answer}}}", f"\\boxed{{{int(answer) + 10}}}"))
        self.events.add("assistant.generate", start, time.perf_counter())
        return replies


class FakeTokenizer:
    """Token id k decodes to COMPLETIONS[k] (a rollout's response is one token); the prompt token 99 to "Q: "."""

    def decode(self, ids, skip_special_tokens=True):
        if ids.dim() == 2:
            return [self.decode(row) for row in ids]
        return "".join(COMPLETIONS[int(i)] if int(i) < len(COMPLETIONS) else "Q: " for i in ids)


class FakeExperienceMaker:
    def make_experience_batch(self, samples):
        time.sleep(0.05)
        for sample in samples:
            if sample.rewards is None:
                raise AssertionError("a sample reached the experience maker without a reward")
        return [SimpleNamespace(sequences=s.sequences, info=dict(s.info), response_length=torch.tensor([1.0]),
                                truncated=torch.tensor([0.0])) for s in samples]


def samples():
    rows = []
    for i, completion in enumerate(COMPLETIONS):
        p = i // N
        rows.append(SimpleNamespace(prompts=[f"<chat>{QUESTIONS[p]}"], labels=[REFERENCES[p]],
                                    sequences=torch.tensor([[99, i]]), action_mask=torch.tensor([[1]]),
                                    rewards=None, info={}))
    return rows


# ------------------------------------------------------------------------------------------- the setup
ARGS_CACHE: dict = {}


def parsed_args(tmp_path_factory, flags: tuple[str, ...]):
    """Real `train_cooper.parse_args` (OpenRLHF's parser and validation + Cooper's), cached per flag set."""
    if flags not in ARGS_CACHE:
        from cooper_openrlhf.cli.train_cooper import parse_args

        data = tmp_path_factory.mktemp("data") / "prompts.jsonl"
        data.write_text("".join(f'{{"input": "{q}", "label": "{r}"}}\n' for q, r in zip(QUESTIONS, REFERENCES)))
        base = ["--actor.model_name_or_path", "policy", "--data.prompt_dataset", str(data), "--data.input_key", "input",
                "--data.label_key", "label", "--rollout.n_samples_per_prompt", str(N), "--rollout.batch_size", "3",
                "--train.batch_size", "6", "--train.micro_batch_size", "1", "--rollout.micro_batch_size", "1",
                "--algo.advantage.estimator", "group_norm", "--vllm.num_engines", "1", "--actor.num_gpus_per_node", "1",
                "--ref.num_gpus_per_node", "1", "--reward.num_gpus_per_node", "1"]
        ARGS_CACHE[flags] = parse_args(base + list(flags))
    return ARGS_CACHE[flags]


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(num_workers=1, deadline_s=5.0, config=RuleVerifierConfig(answer_fallback="none")) as shared:
        yield shared


@pytest.fixture
def make_trainer(monkeypatch, pool, tmp_path_factory):
    from openrlhf.trainer import ppo_trainer
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
    from openrlhf.trainer.ray import vllm_engine

    from cooper_openrlhf.ray import checkpoints, evaluation, rm_scoring
    from cooper_openrlhf.ray import trainer as trainer_module
    from cooper_openrlhf.core.pair_builder import PairBuilder

    for module in (trainer_module, checkpoints, evaluation, rm_scoring, ppo_trainer, vllm_engine):
        monkeypatch.setattr(module, "ray", FakeRay)

    def make(flags=(), assistant_seconds=0.0, policy_seconds=0.05):
        args = parsed_args(tmp_path_factory, tuple(flags))
        for group, key in ((args.eval, "steps"), (args.ckpt, "save_steps")):  # as PPOTrainer.__init__ does
            if getattr(group, key) == -1:
                setattr(group, key, float("inf"))
        events = Events()
        trainer = trainer_module.CooperPPOTrainer.__new__(trainer_module.CooperPPOTrainer)
        trainer.args, trainer.strategy = args, SimpleNamespace(args=args)
        trainer.tokenizer = FakeTokenizer()
        trainer.experience_maker = FakeExperienceMaker()
        trainer.kl_ctl = FixedKLController(0.0)
        trainer.critic_model_group = None
        trainer.wandb_logger = trainer.tensorboard_logger = None
        trainer.best_eval_metric_key, trainer.best_eval_metric_value, trainer._latest_eval_metric_value = "", 0.0, None
        on_disk = args.ckpt.path if "--ckpt.path" in flags else None
        trainer.policy = FakePolicy(policy_seconds, on_disk and os.path.join(on_disk, "_actor"))
        trainer.actor_model_group = FakeGroup([FakeActor(trainer.policy, "policy", events)])
        trainer.vllm_engines = [FakeActor(FakeEngine(), "engine", events)]
        builder = PairBuilder(pool, SlowAssistant(assistant_seconds, events), NegativeConfig(retries=1),
                              answer_fallback="none")
        rm = FakeRM(on_disk and os.path.join(on_disk, "_rm"))
        rm_group = None
        if args.reward.model_name_or_path:
            rm_group = FakeGroup([FakeActor(rm, "rm", events)])
        trainer.init_cooper(rm_group, FakeActor(builder, "pairs", events),
                            {f"<chat>{q}": q for q in QUESTIONS})
        return trainer, events, rm

    return make


RM = ("--reward.model_name_or_path", "rm")
COOPER = ("--remote_rm_trainable", *RM)
# Every combination of the step's control-flow flags that the validation accepts (vLLM's sleep only
# exists with colocate_all: OpenRLHF's validation turns it off otherwise).
PLACEMENTS = [(), ("--train.colocate_all",), ("--ds.enable_sleep",), ("--train.colocate_all", "--ds.enable_sleep"),
              ("--train.colocate_all", "--vllm.enable_sleep"),
              ("--train.colocate_all", "--ds.enable_sleep", "--vllm.enable_sleep")]
ARMS = [COOPER, (*COOPER, "--cooper.negative_source", "rollout"), (*COOPER, "--cooper.negative_source", "mixed"),
        (*COOPER, "--cooper.rm_update_granularity", "minibatch", "--cooper.rm_mini_batch_size", "1"),
        (*COOPER, "--cooper.reward_source", "rule"), RM, ("--cooper.reward_source", "rule")]


@pytest.mark.parametrize("placement", PLACEMENTS, ids=lambda f: "+".join(x.split(".")[-1] for x in f) or "separate")
@pytest.mark.parametrize("arm", ARMS, ids=["cooper", "rollout", "mixed", "minibatch", "cooper-rule", "static", "rule"])
def test_a_step_completes_with_rewards_pairs_and_rm_update_as_configured(make_trainer, placement, arm):
    trainer, events, rm = make_trainer(arm + placement)
    batch = samples()
    status, next_step = trainer.train_step(batch, 4)
    assert next_step == 5
    rewards = [float(s.rewards[0]) for s in batch]
    if trainer.cooper.reward_source == "rule":
        assert rewards == [float(v) for v in VERIFIED]
    else:  # sigmoid of the logit of the RM before this step's update (a fresh FakeRM)
        logits = FakeRM().score([""] * 6, [r for r in REFERENCES for _ in range(N)], COMPLETIONS)
        assert rewards == pytest.approx(torch.sigmoid(torch.tensor(logits)).tolist())
    assert status["cooper/verified_accuracy"] == pytest.approx(3 / 6)
    assert status["policy_loss"] == pytest.approx(0.1)  # OpenRLHF's ppo_train ran and its status came back
    if not trainer.rm_trainable:
        assert events.count("rm.fit") == 0 and "cooper/valid_pair_rate" not in status
        return
    source = trainer.cooper.negative_source
    # Prompt 0 (right + wrong) always has a pair; prompt 1 (two right) only from the assistant; prompt 2 none.
    expected_valid = {"assistant": 2, "rollout": 1, "mixed": 2}[source]
    fitted = [pairs for pairs, _ in rm.fits]
    assert sum(p.num_valid for p in fitted) == expected_valid
    assert status["cooper/valid_pair_rate"] == pytest.approx(expected_valid / 3)
    minibatch = trainer.cooper.rm_update_granularity == "minibatch"
    assert events.count("rm.fit") == (expected_valid if minibatch else 1)
    assert events.names().index("rm.score") < events.names().index("rm.fit")  # rewards of step t: the RM before its update
    if trainer.args.ds.enable_sleep:
        order = [n for n in events.names() if n in ("rm.reload_states", "rm.fit", "rm.offload_states")]
        assert order[0] == "rm.reload_states" and order[-1] == "rm.offload_states"
    assert events.count("assistant.generate") == (0 if source == "rollout" else 1)


def test_answerless_rollouts_become_negatives_only_with_the_flag(make_trainer, monkeypatch):
    # Prompt 0: right, then no answer at all; prompts 1 and 2 as before (no wrong rollout beside a positive).
    monkeypatch.setitem(globals(), "COMPLETIONS", [COMPLETIONS[0], "I am not sure", *COMPLETIONS[2:]])
    rollout = (*COOPER, "--cooper.negative_source", "rollout")
    for flags, expected_valid in ((rollout, 0), ((*rollout, "--cooper.answerless_negatives"), 1)):
        trainer, _, rm = make_trainer(flags)
        status, _ = trainer.train_step(samples(), 1)
        assert sum(pairs.num_valid for pairs, _ in rm.fits) == expected_valid
        assert status["cooper/pairs_answerless_negative"] == pytest.approx(float(expected_valid))
    (pairs, _), = rm.fits
    assert pairs.valid[0] and pairs.negatives[0] == "I am not sure" and pairs.negative_source[0] == "rollout"


@pytest.mark.parametrize("arm", [RM, COOPER], ids=["static", "cooper"])
def test_require_answer_pays_answerless_rollouts_nothing_and_logs_the_gated_reward(make_trainer, arm):
    # COMPLETIONS[4] ("I am not sure") has no final answer; every other rollout keeps the RM's reward.
    logits = FakeRM().score([""] * 6, [r for r in REFERENCES for _ in range(N)], COMPLETIONS)
    paid = torch.sigmoid(torch.tensor(logits)).tolist()
    paid[4] = 0.0
    trainer, _, _ = make_trainer((*arm, "--cooper.require_answer"))
    batch = samples()
    status, _ = trainer.train_step(batch, 1)
    assert [float(s.rewards[0]) for s in batch] == pytest.approx(paid)
    assert status["cooper/rm_reward_mean"] == pytest.approx(sum(paid) / 6)
    ungated, _, _ = make_trainer(arm)
    batch = samples()
    ungated.train_step(batch, 1)
    assert float(batch[4].rewards[0]) > 0.0  # without the flag the RM's own reward


def test_rewrites_run_while_the_rm_scores_and_the_rm_trains_beside_the_policy(make_trainer):
    trainer, events, _ = make_trainer(COOPER, assistant_seconds=0.4, policy_seconds=1.0)
    status, _ = trainer.train_step(samples(), 1)
    rewrite_start, rewrite_end = events.span("assistant.generate")
    score_start, _ = events.span("rm.score")
    assert score_start < rewrite_end  # scoring did not wait for the slowed assistant
    fit_start, _ = events.span("rm.fit")
    policy_start, policy_end = events.span("policy.fit")
    assert fit_start < policy_end  # the RM update ran beside the policy update
    assert events.span("policy.broadcast_to_vllm")[0] >= rewrite_end  # no weight sync under the assistant's feet
    assert status["timeline/rewrites_end"] > status["timeline/score_start"]
    assert "timing/cooper_negatives" not in status  # it overlapped: not summed into OpenRLHF's step total


@pytest.mark.parametrize("colocated", [False, True])
def test_colocated_rm_hands_its_cached_memory_back_after_scoring_and_after_its_update(make_trainer, colocated):
    """As stock OpenRLHF does after its reward forwards: on shared GPUs the RM's cache is emptied before the
    policy's turn, and (issue 43) after the RM's own update, before the engines wake for the next rollouts; on
    GPUs of its own it is left alone."""
    trainer, events, _ = make_trainer((*COOPER, "--train.colocate_all") if colocated else COOPER)
    trainer.train_step(samples(), 1)
    assert events.count("rm.empty_cache") == (2 if colocated else 0)
    if colocated:
        assert events.span("rm.score")[1] <= events.span("rm.empty_cache", 0)[0] <= events.span("policy.fit")[0]
        assert events.span("rm.fit")[1] <= events.span("rm.empty_cache", 1)[0]


def test_colocated_steps_stay_serial(make_trainer):
    trainer, events, _ = make_trainer((*COOPER, "--train.colocate_all"), assistant_seconds=0.3)
    trainer.train_step(samples(), 1)
    assert events.span("rm.score")[0] >= events.span("assistant.generate")[1]
    assert events.span("rm.fit")[0] >= events.span("policy.fit")[1]


def test_sleeping_engines_are_woken_once_for_the_rewrites_and_put_back(make_trainer):
    flags = (*COOPER, "--train.colocate_all", "--vllm.enable_sleep")
    trainer, events, _ = make_trainer(flags)
    status, _ = trainer.train_step(samples(), 1)
    # One wake/sleep pair for the rewrites, plus the weights-only wake of OpenRLHF's own weight sync.
    assert (events.count("engine.wake_up"), events.count("engine.sleep")) == (2, 1)
    assert status["cooper/vllm_wake_sleep_pairs"] == 1.0
    rollout_only, events, _ = make_trainer((*flags, "--cooper.negative_source", "rollout"))
    rollout_only.train_step(samples(), 1)
    assert (events.count("engine.wake_up"), events.count("engine.sleep")) == (1, 0)  # nothing to generate


def test_the_next_step_is_scored_by_the_updated_rm(make_trainer):
    trainer, _, rm = make_trainer(COOPER)
    first = samples()
    trainer.train_step(first, 1)
    second = samples()
    trainer.train_step(second, 2)
    assert rm.bias == 1.0
    shift = [torch.logit(s2.rewards) - torch.logit(s1.rewards) for s1, s2 in zip(first, second)]
    assert all(float(d) == pytest.approx(0.5, abs=1e-4) for d in shift)


def test_each_distinct_rollout_is_scored_once_over_the_rm_ranks_and_every_copy_gets_its_logit(make_trainer):
    from cooper_openrlhf.core import RolloutTexts

    trainer, events, _ = make_trainer(COOPER)
    ranks = [FakeRM(), FakeRM()]
    trainer.rm_group = FakeGroup([FakeActor(rm, f"rm{i}", events) for i, rm in enumerate(ranks)])
    scored = []
    for rm in ranks:
        score = rm.score
        rm.score = lambda q, r, c, score=score: scored.append(list(zip(q, r, c))) or score(q, r, c)
    # Prompt 0's group writes the same right answer three times; prompt 1's two wrong answers twice each.
    texts = RolloutTexts(["a"] * 3 + ["b"] * 4, ["2"] * 3 + ["4"] * 4,
                         ["\\boxed{2}"] * 3 + ["\\boxed{5}", "\\boxed{6}", "\\boxed{5}", "\\boxed{6}"])
    logits = trainer.rm_logits(texts)
    assert logits.tolist() == [2.0, 2.0, 2.0, -1.0, -1.0, -1.0, -1.0]
    assert [len(part) for part in scored] == [2, 1]  # three distinct triples, split over the two ranks
    assert sorted(t for part in scored for t in part) == sorted(set(zip(texts.questions, texts.references,
                                                                        texts.completions)))
    assert trainer.rm_logits(RolloutTexts(["a"], ["2"], ["\\boxed{2}"])).tolist() == [2.0]  # one rank idle


def test_a_failing_stage_fails_the_step(make_trainer):
    trainer, _, rm = make_trainer(COOPER)

    def broken(*args):
        raise RuntimeError("RM rank died")

    rm.score = broken
    with pytest.raises(RuntimeError, match="RM rank died"):
        trainer.train_step(samples(), 1)


# The static arm's gap is constant: RM reward 0.575 (FakeRM) - verified accuracy 0.5 = 0.075 on every step.
ALARM_AT_STEP_3 = ("--cooper.hacking_window", "3", "--cooper.hacking_gap_ceiling", "0.05")


def test_the_hacking_alarm_switches_the_reward_to_the_rule_verifier_with_rule_reward(make_trainer):
    trainer, _, _ = make_trainer((*RM, *ALARM_AT_STEP_3, "--cooper.on_hacking", "rule_reward"))
    statuses, rewards = [], []
    for step in range(4):
        batch = samples()
        status, _ = trainer.train_step(batch, step)
        statuses.append(status)
        rewards.append([float(s.rewards[0]) for s in batch])
    assert [s["cooper/hacking_alarm"] for s in statuses] == [0.0, 0.0, 1.0, 1.0]
    assert [s["cooper/reward_from_rule"] for s in statuses] == [0.0, 0.0, 1.0, 1.0]
    assert rewards[2] != [float(v) for v in VERIFIED]  # the alarm's step was still paid by the RM
    assert rewards[3] == [float(v) for v in VERIFIED]
    assert statuses[3]["cooper/rm_reward_mean"] == pytest.approx(statuses[0]["cooper/rm_reward_mean"])  # still logged


def test_the_hacking_alarm_with_stop_checkpoints_the_step_then_ends_the_run(make_trainer):
    from cooper_openrlhf.algo.hacking import HackingAlarm

    trainer, _, _ = make_trainer((*RM, *ALARM_AT_STEP_3, "--cooper.on_hacking", "stop"))
    for step in range(2):
        status, next_step = trainer.train_step(samples(), step)
        trainer.save_logs_and_checkpoints(next_step, status, {})
    assert not hasattr(trainer.policy, "saved")  # --ckpt.save_steps is off: no checkpoint before the alarm
    status, next_step = trainer.train_step(samples(), 2)
    with pytest.raises(HackingAlarm, match="saved checkpoint global_step3"):
        trainer.save_logs_and_checkpoints(next_step, status, {})
    assert trainer.policy.saved == "global_step3"


def test_the_rm_checkpoint_follows_the_policys_including_its_best_and_its_rotation(make_trainer):
    """RM and policy checkpoints are one unit: the RM saves under the policy's tag (the best one too), then keeps
    exactly the tags the policy's metric-ordered rotation kept."""
    trainer, events, rm = make_trainer((*COOPER, "--ckpt.save_steps", "1"))
    trainer.save_logs_and_checkpoints(1, {}, {"global_step": 1})
    assert rm.saved == ["global_step1"] and trainer.policy.saved == "global_step1"
    assert events.span("rm.keep_policy_tags")[0] >= events.span("policy.save_checkpoint")[1]
    trainer.best_eval_metric_key = "eval_pass1"
    trainer.save_best_checkpoint({"eval_pass1": 0.5}, 2, {"global_step": 2})
    assert rm.saved[-1] == trainer.policy.saved == "best_global_step2"
    assert events.count("rm.keep_policy_tags") == 2


def test_a_run_requeued_after_a_best_save_resumes_the_rm_at_the_policys_best_tag(make_trainer, tmp_path):
    """Issue 43: step 3 was evaluated (the best so far) but not a save step, so OpenRLHF saved the policy as
    best_global_step3 only and pointed its `latest` there; the requeued run must load the RM saved beside it
    (the RM was asked for global_step3, which does not exist, and the run failed)."""
    flags = (*COOPER, "--ckpt.save_steps", "2", "--ckpt.path", str(tmp_path / "ckpt"), "--ckpt.load_enable")
    trainer, _, rm = make_trainer(flags)
    for step in (1, 2, 3):
        trainer.save_logs_and_checkpoints(step, {}, {"global_step": step, "episode": 0, "total_consumed_prompts": 3 * step,
                                                     "data_loader_state_dict": {}})
    trainer.best_eval_metric_key = "eval_pass1"
    trainer.save_best_checkpoint({"eval_pass1": 0.5}, 3, {"global_step": 3, "episode": 0, "total_consumed_prompts": 9,
                                                           "data_loader_state_dict": {}})
    assert sorted(os.listdir(tmp_path / "ckpt" / "_rm")) == ["best_global_step3", "global_step2", "latest"]

    requeued, _, rm = make_trainer(flags)  # a new job on the same folder
    states = requeued.init_checkpoint_states()
    assert states["global_step"] == 3 and rm.loaded == "best_global_step3"


def test_stale_rm_checkpoints_are_the_tags_the_policy_no_longer_has(tmp_path):
    from cooper_openrlhf.ray.reward_actor import stale_rm_checkpoints

    for side, tags in (("_actor", ["global_step4", "best_global_step2"]),
                       ("_rm", ["global_step2", "global_step4", "best_global_step2", "best_global_step1"])):
        for tag in tags:
            (tmp_path / side / tag).mkdir(parents=True)
    (tmp_path / "_rm" / "latest").write_text("global_step4")  # DeepSpeed's pointer file is not a checkpoint
    assert stale_rm_checkpoints(str(tmp_path / "_rm"), str(tmp_path / "_actor")) == ["best_global_step1",
                                                                                       "global_step2"]


def test_a_healthy_run_never_alarms(make_trainer):
    trainer, _, _ = make_trainer((*RM, "--cooper.hacking_window", "3", "--cooper.on_hacking", "stop"))
    for step in range(5):
        status, _ = trainer.train_step(samples(), step)
        assert status["cooper/hacking_alarm"] == 0.0  # a steady gap of 0.075 is far below the default ceiling


def test_a_window_of_steps_without_a_correct_rollout_warns_once_naming_the_likely_causes(make_trainer, caplog):
    from cooper_openrlhf.ray.trainer import NO_CORRECT_ROLLOUT_WINDOW

    trainer, _, _ = make_trainer(("--cooper.reward_source", "rule"))

    def nothing_verifies():  # the same rollouts against references no rollout states (raw labels, say)
        batch = samples()
        for sample in batch:
            sample.labels = ["12345"]
        return batch

    def warnings():
        return [r.getMessage() for r in caplog.records if "no rollout was verified correct" in r.getMessage()]

    trainer.train_step(nothing_verifies(), 0)
    trainer.train_step(samples(), 1)  # a correct rollout resets the window
    warned_at = []
    for step in range(2, 2 + 2 * NO_CORRECT_ROLLOUT_WINDOW):
        status, _ = trainer.train_step(nothing_verifies(), step)
        assert status["cooper/verified_accuracy"] == 0.0
        warned_at += [step] * (len(warnings()) - len(warned_at))
    assert warned_at == [1 + NO_CORRECT_ROLLOUT_WINDOW]  # the window'th empty step after the reset, and only then
    assert "--data.label_key holds whole solutions" in warnings()[0] and "--rollout.max_new_tokens" in warnings()[0]


def test_offline_pairs_replace_only_where_the_rm_updates_pairs_come_from(make_trainer, tmp_path):
    """--cooper.offline_pairs (the lab's offline_pairs control): no rewrite is requested, and each step's RM update
    trains on that step's group of the file; rollouts, scoring and the policy update are Cooper's."""
    import json

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"step": s, "question": f"Q{s}?", "reference": str(s), "positive": f"is {s}",
                                        "negative": f"is {s + 1}"}) + "\n" for s in range(3) for _ in range(2)))
    trainer, events, rm = make_trainer((*COOPER, "--cooper.offline_pairs", str(path)))
    status, _ = trainer.train_step(samples(), 1)
    assert "assistant.generate" not in events.names()
    (pairs, global_valid), = rm.fits
    assert pairs.questions == ["Q1?", "Q1?"] and pairs.negatives == ["is 2", "is 2"] and global_valid == 2
    assert status["cooper/offline_pairs"] == 2.0 and status["cooper/rm_updated"] == 1.0
    assert "cooper/rm_reward_mean" in status  # the policy is still paid by the RM
