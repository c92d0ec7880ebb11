"""CooperTrainer: OpenRLHF's PPOTrainer running Cooper's step (arXiv 2508.05613, Algorithm 1).

One step (`CooperPPOTrainer.train_step`), each phase a method with its own `timing/cooper_*` key:
  decode    rollouts -> (raw question, reference = the prompt's label, completion text)
  verify    the pair-construction actor's rule verifier judges every rollout
  negatives per prompt, first verified-correct rollout -> assistant rewrite -> verified-different negative
  score     the RM group scores the texts through the VerifyRM template; the rewards are set on the samples,
            so OpenRLHF's experience maker skips its frozen-RM forward
  policy    `super().train_step`: OpenRLHF's GRPO update unchanged (make_experience, ppo_train, weight sync)
  RM update masked pairwise loss on the step's valid pairs (only with --remote_rm_trainable)
  metrics   RM reward next to the rule-verified accuracy of the same rollouts (the reward-hacking gap)

How it departs from the paper and its official recipe:
- Negatives are built before the policy update, right after generation, while the vLLM engines are awake
  (the paper draws them after it). They depend only on the step's rollouts, so nothing changes but the
  saved wake/sleep. The default assistant is the policy itself on its own engines; the paper's separate
  assistant model is `--cooper.assistant model`.
- When the RM has its own GPUs, its update runs concurrently with the policy update (the paper runs them
  one after the other). The math is the same: the policy update of step t uses rewards of the RM before
  its update at step t, and step t+1 is scored by the updated RM. Colocated, it runs after the policy
  update as OpenRLHF's reload -> fit -> offload.
- A negative counts only when the rule verifier proves its answer differs from the positive's; the
  positive is the first verified-correct rollout in batch order (the recipe iterated a set); prompts
  without either are masked out and counted, never dropped silently; non-finite RM steps are skipped.
- The RM reads (raw question, reference, completion) text, never the policy's chat-templated prompt: the
  raw question is recovered from the dataset (`prompt_question_map`) and a prompt it cannot recover fails.
"""

import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass

import ray
import torch
from openrlhf.datasets.prompts_dataset import preprocess_data
from openrlhf.datasets.utils import blending_datasets
from openrlhf.trainer.ppo_trainer import PPOTrainer
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call
from openrlhf.utils.logging_utils import init_logger

from cooper_openrlhf.algo.pairs import PairBatch, even_slices
from cooper_openrlhf.algo.rewards import get_reward_form, rule_reward

logger = init_logger(__name__)  # OpenRLHF's logger: visible in Ray worker output like its own

_PPOTrainer = PPOTrainer.__ray_metadata__.modified_class  # Ray actor classes cannot be subclassed directly


@dataclass
class RolloutTexts:
    """What the verifier, the assistant and the RM read of one step's rollouts (B = prompts * n, prompt-grouped)."""

    questions: list[str]  # (B,) raw question of the rollout's prompt (the dataset's input_key text)
    references: list[str]  # (B,) reference answer (the dataset's label_key value, as text)
    completions: list[str]  # (B,) the policy's response, decoded without special tokens


def raw_question(row: dict, input_key: str) -> str:
    """The question text of a prompt-dataset row: the input_key string, or the last user turn of a chat."""
    value = row[input_key]
    if isinstance(value, list):
        turns = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        value = turns[-1] if turns else None
    if not isinstance(value, str):
        raise ValueError(f"field {input_key!r} holds {type(value).__name__}, not question text or a chat with a user turn")
    return value


def prompt_question_map(args, strategy, tokenizer) -> dict[str, str]:
    """Rendered prompt (what OpenRLHF's PromptDataset hands the trainer) -> raw question, over the same data.

    Loads --data.prompt_dataset exactly as `openrlhf.trainer.ppo_trainer.prepare_datasets` does and renders
    each row with OpenRLHF's own `preprocess_data`, so the keys are the trainer's prompts byte for byte.
    """
    data = blending_datasets(args.data.prompt_dataset, args.data.prompt_probs, strategy, args.train.seed,
                             max_count=args.data.max_samples, dataset_split=args.data.prompt_split)
    chat = tokenizer.apply_chat_template if args.data.apply_chat_template else None
    questions: dict[str, str] = {}
    for index, row in enumerate(data):
        prompt, _ = preprocess_data(row, args.data.input_template, args.data.input_key, args.data.label_key, chat)
        question = raw_question(row, args.data.input_key)
        if questions.setdefault(prompt, question) != question:
            raise ValueError(f"prompt dataset row {index}: two different questions render to the same prompt {prompt!r}")
    return questions


@contextmanager
def stage_timer(status: dict, key: str):
    """Adds the block's wall time in seconds to status[key] (an OpenRLHF `timing/*` key)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        status[key] = status.get(key, 0.0) + time.perf_counter() - start


class CooperPPOTrainer(_PPOTrainer):
    """PPOTrainer whose `train_step` is Cooper's step (module docstring). Created through `CooperTrainer.remote`.

    reward_model_group: the `TrainableRewardModelActor` RayActorGroup (None for the rule arm without an RM).
    pair_actor: the `PairConstructionActor` handle (verifier pool + assistant).
    The remaining arguments are PPOTrainer's.
    """

    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, pair_actor=None, **generate_kwargs):
        # The base trainer gets no reward group: its experience maker must never run a frozen RM forward
        # (it raises if a sample reaches it without rewards).
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, None, reference_model_group,
                         vllm_engines, **generate_kwargs)
        if pair_actor is None:
            raise ValueError("CooperTrainer needs the pair-construction actor (verification runs every step)")
        self.rm_group = reward_model_group
        self.pair_actor = pair_actor
        self.cooper = self.args.cooper
        self.rm_trainable = bool(self.args.remote_rm_trainable)
        if (self.rm_trainable or self.cooper.reward_source == "rm") and reward_model_group is None:
            raise ValueError("the RM arm needs a reward-model group")
        self.reward_form = get_reward_form(self.cooper.reward_form)
        self.questions = prompt_question_map(self.args, strategy, self.tokenizer)
        self.sample_log_dir = self.cooper.sample_log_dir
        if self.sample_log_dir:
            os.makedirs(self.sample_log_dir, exist_ok=True)

    # ------------------------------------------------------------------------------------ the step
    def train_step(self, rollout_samples, global_step: int):
        """One Cooper step (module docstring); returns OpenRLHF's (status, next global step) with Cooper's metrics."""
        metrics: dict = {}
        with stage_timer(metrics, "timing/cooper_decode"):
            texts = self.decode_rollouts(rollout_samples)
        with stage_timer(metrics, "timing/cooper_verify"):
            verified = self.verify(texts, metrics)
        with stage_timer(metrics, "timing/cooper_negatives"):
            pairs = self.build_negatives(texts, verified, global_step, metrics)
        with stage_timer(metrics, "timing/cooper_score"):
            rewards = self.score(rollout_samples, texts, verified, metrics)
        rm_update = self.start_rm_update(pairs)  # runs beside the policy update when the RM has its own GPUs
        status, next_step = super().train_step(rollout_samples, global_step)  # policy: GRPO + weight sync
        with stage_timer(metrics, "timing/cooper_rm_update"):
            self.finish_rm_update(pairs, rm_update, metrics)
        self.log_samples(next_step, texts, verified, rewards, pairs)
        status.update(metrics)
        return status, next_step

    def decode_rollouts(self, samples) -> RolloutTexts:
        """Raw question, reference and completion text of every rollout, in batch order."""
        questions, references, completions = [], [], []
        for sample in samples:
            prompt = sample.prompts[0]
            if prompt not in self.questions:
                raise KeyError(f"rollout prompt not found in --data.prompt_dataset (cannot recover its raw question): "
                               f"{prompt[:200]!r}")
            questions.append(self.questions[prompt])
            references.append(str(sample.labels[0]))
            response = sample.sequences[0][1:][sample.action_mask[0].bool()]  # action_mask is aligned to sequences[1:]
            completions.append(self.tokenizer.decode(response, skip_special_tokens=True))
        return RolloutTexts(questions, references, completions)

    def verify(self, texts: RolloutTexts, metrics: dict) -> list[bool]:
        """Rule-verifier verdicts (True = verified correct) for every rollout."""
        verified, verify_metrics = ray.get(self.pair_actor.verify.remote(texts.references, texts.completions))
        metrics.update({k: v for k, v in verify_metrics.items() if not k.startswith("timing/")})
        return verified

    def build_negatives(self, texts: RolloutTexts, verified: list[bool], global_step: int, metrics: dict):
        """The step's PairBatch (None without --remote_rm_trainable), built while the engines are awake."""
        if not self.rm_trainable:
            return None
        wake = self.args.vllm.enable_sleep and self.cooper.assistant == "policy"
        if wake:
            batch_vllm_engine_call(self.vllm_engines, "wake_up")
        try:
            pairs, pair_metrics = ray.get(self.pair_actor.build_pairs.remote(
                texts.questions, texts.references, texts.completions, verified,
                self.args.rollout.n_samples_per_prompt, step=global_step,
            ))
        finally:
            if wake:
                batch_vllm_engine_call(self.vllm_engines, "sleep")
        metrics.update({k: v for k, v in pair_metrics.items() if not k.startswith("timing/")})
        return pairs

    def score(self, samples, texts: RolloutTexts, verified: list[bool], metrics: dict) -> torch.Tensor:
        """Set each sample's reward (RM reward form, or the rule reward); returns the (B,) rewards."""
        accuracy = sum(verified) / len(verified)
        metrics["cooper/verified_accuracy"] = accuracy
        rewards = rule_reward(verified)
        if self.rm_group is not None:
            rm_rewards = self.reward_form(self.rm_logits(texts), self.cooper.reward_threshold)
            metrics["cooper/rm_reward_mean"] = rm_rewards.mean().item()
            metrics["cooper/reward_hacking_gap"] = metrics["cooper/rm_reward_mean"] - accuracy
            if self.cooper.reward_source == "rm":
                rewards = rm_rewards
        for sample, reward in zip(samples, rewards):
            sample.rewards = reward.reshape(1).clone()
            sample.info["reward"] = reward.reshape(1).clone()
        return rewards

    def rm_logits(self, texts: RolloutTexts) -> torch.Tensor:
        """(B,) RM logits, the batch split evenly over the RM ranks."""
        actors = self.rm_group._actor_handlers
        refs = [actor.score.remote(texts.questions[part], texts.references[part], texts.completions[part])
                for actor, part in zip(actors, even_slices(len(texts.completions), len(actors)))]
        return torch.tensor([logit for chunk in ray.get(refs) for logit in chunk], dtype=torch.float32)

    def start_rm_update(self, pairs: PairBatch | None):
        """Launch the RM update now when the RM has its own GPUs; else it runs in `finish_rm_update`."""
        if pairs is None or self.args.train.colocate_all:
            return None
        return self._launch_fit(pairs)

    def finish_rm_update(self, pairs: PairBatch | None, refs, metrics: dict) -> None:
        """Wait for (or, colocated, run reload -> fit -> offload) the RM update and merge its metrics."""
        if pairs is None:
            return
        sleeping = self.args.train.colocate_all and self.args.ds.enable_sleep
        if refs is None:
            if sleeping:
                ray.get(self.rm_group.async_run_method(method_name="reload_states"))
            refs = self._launch_fit(pairs)
        results = ray.get(refs)
        if sleeping:
            ray.get(self.rm_group.async_run_method(method_name="offload_states"))
        metrics.update(results[0])  # all-reduced: every rank returns the same metrics

    def _launch_fit(self, pairs: PairBatch) -> list:
        trainable = pairs.valid_only()
        actors = self.rm_group._actor_handlers
        parts = trainable.split(len(actors))
        return [actor.fit.remote(part, trainable.num_valid) for actor, part in zip(actors, parts)]

    def log_samples(self, step: int, texts: RolloutTexts, verified, rewards, pairs: PairBatch | None) -> None:
        """With --cooper.sample_log_dir: append the step's rollouts and pairs as JSON lines."""
        if not self.sample_log_dir:
            return
        rollouts = [
            {"step": step, "question": q, "reference": r, "completion": c, "verified": bool(v), "reward": float(w)}
            for q, r, c, v, w in zip(texts.questions, texts.references, texts.completions, verified, rewards.tolist())
        ]
        _append_jsonl(os.path.join(self.sample_log_dir, "rollouts.jsonl"), rollouts)
        if pairs is not None:
            rows = [
                {"step": step, "question": q, "reference": r, "positive": p, "negative": n, "valid": v, "positive_index": i}
                for q, r, p, n, v, i in zip(pairs.questions, pairs.references, pairs.positives, pairs.negatives,
                                            pairs.valid, pairs.positive_index or [-1] * len(pairs))
            ]
            _append_jsonl(os.path.join(self.sample_log_dir, "pairs.jsonl"), rows)

    # -------------------------------------------------------------------------------- checkpoints
    def init_checkpoint_states(self):
        """OpenRLHF's resume, plus the RM checkpoint of the same global step (model, optimizer, scheduler, counters)."""
        states = super().init_checkpoint_states()
        step = states["global_step"]
        if self.rm_trainable and step > 0:
            rm_states = ray.get(self.rm_group.async_run_method(method_name="load_checkpoint", tag=f"global_step{step}"))[0]
            if rm_states.get("global_step") != step:
                raise RuntimeError(f"the RM checkpoint global_step{step} records step {rm_states.get('global_step')}")
            logger.info("resumed the Cooper RM at global step %d: %s", step, rm_states.get("cooper_rm_counters"))
        return states

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        """OpenRLHF's logging and policy checkpoint, with the RM checkpoint saved alongside under the same tag."""
        rm_refs = []
        if self.rm_trainable and global_step % self.args.ckpt.save_steps == 0:
            rm_refs = self.rm_group.async_run_method(method_name="save_checkpoint", tag=f"global_step{global_step}",
                                                     client_states=dict(client_states or {}))
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        ray.get(rm_refs)


def _append_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
        handle.flush()


CooperTrainer = ray.remote(CooperPPOTrainer)
