"""The fakes behind `CooperPPOTrainer`'s middle-layer tests (test_cooper_trainer_step.py, test_cooper_trainer_checkpoints.py).

The trainer's own code and OpenRLHF's `train_step` / `ppo_train` / `broadcast_to_vllm` run unchanged; only
what sits behind Ray handles is faked (as OpenRLHF's own tests/test_ppo_trainer.py does): `ray` in the
modules that call it becomes a thread-backed stand-in in which each fake actor runs its calls in order
on its own thread, like a Ray actor. The pair actor is the real `PairBuilder` with the real verifier
pool; its assistant is a fake engine that can be slowed down. Each fake records when its calls ran, so the
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
# The static arm's gap is constant: RM reward 0.575 (FakeRM) - verified accuracy 0.5 = 0.075 on every step.
ALARM_AT_STEP_3 = ("--cooper.hacking_window", "3", "--cooper.hacking_gap_ceiling", "0.05")
