"""CooperTrainer: OpenRLHF's PPOTrainer running Cooper's step (arXiv 2508.05613, Algorithm 1).

One step (`CooperPPOTrainer.train_step`), each phase a method with its own `timing/cooper_*` key:
  decode     rollouts -> (raw question, reference = the prompt's label, completion text)
  verify     the pair-construction actor's rule verifier judges every rollout (correct / proved wrong)
  negatives  requested now: the assistant rewrites each prompt's positive on the vLLM engines, in the
             background (`--cooper.negative_source` assistant / mixed; rollout needs no generation)
  score      meanwhile the RM group scores the texts through the VerifyRM template; the rewards are set
             on the samples, so OpenRLHF's experience maker skips its frozen-RM forward
  policy     `super().train_step`: OpenRLHF's GRPO update unchanged (make_experience, ppo_train, weight
             sync); `ppo_train` collects the step's pairs and launches the RM update beside the policy's
  RM update  masked pairwise loss on the step's valid pairs (only with --remote_rm_trainable)
  metrics    RM reward next to the rule-verified accuracy of the same rollouts (the reward-hacking gap),
             and `timeline/<stage>_start|_end` (seconds from the step's start) for the step benchmark

Overlap. With the RM and the engines on devices of their own (no --train.colocate_all, no
--ds.enable_sleep) the rewrites run on the engines while the RM scores and the actor makes experience,
and the RM update runs beside the policy update. Colocated (or with sleeping DeepSpeed states) the
order is serial: negatives right after verification, the RM update after the policy update as
OpenRLHF's reload -> fit -> offload. Either way the math is the paper's: the rewards of step t come
from the RM before its update at step t (scoring is submitted to the RM actors before the update), and
step t+1 is scored by the updated RM. The weight sync into the engines waits for the rewrites.

How it departs from the paper and its official recipe:
- Negatives are requested right after verification, not after the policy update; they depend only on
  the step's rollouts, so nothing changes but the time. The default assistant is the policy itself on
  its own engines; the paper's separate assistant model is `--cooper.assistant model`. With
  --vllm.enable_sleep OpenRLHF puts the engines to sleep after generating the rollouts, so a step with
  rewrites adds one wake_up/sleep pair (`cooper/vllm_wake_sleep_pairs`).
- A negative counts only when the rule verifier proves its answer differs; positives are the first
  verified-correct rollout in batch order (the recipe iterated a set); both sides of a pair, and every
  completion the RM scores, go through the same `normalize_solution`; prompts without a pair are
  masked out and counted, never dropped silently; non-finite RM steps are skipped.
- The RM reads (raw question, reference, completion) text, never the policy's chat-templated prompt: the
  raw question is recovered from the dataset (`prompt_question_map`) and a prompt it cannot recover fails.
And from stock OpenRLHF: `--train.seed` fixes the prompt order (stock leaves the trainer's prompt sampler seeded
from an unseeded RNG, so each run drew its own order and the arms of one seed trained on different problems).
"""

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor

import ray
import torch
from openrlhf.trainer.ppo_trainer import PPOTrainer, compute_eval_metrics
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call
from openrlhf.utils.logging_utils import init_logger

from cooper_openrlhf.algo import selection
from cooper_openrlhf.algo.hacking import (
    HackingAlarm,
    HackingMonitor,
    HackingMonitorConfig,
    guard_step,
    heldout_rm_gap,
    rm_reward_by_verdict,
)
from cooper_openrlhf.algo.negatives import normalize_solution
from cooper_openrlhf.algo.pairs import NO_POSITIVE, PairBatch, even_slices
from cooper_openrlhf.algo.rewards import gate_answerless, get_reward_form, rule_reward
from cooper_openrlhf.ray.step_records import (
    PendingPairs,
    RolloutTexts,
    StepTimeline,
    append_jsonl,
    merge_rm_metrics,
    prompt_question_map,
)

logger = init_logger(__name__)  # OpenRLHF's logger: visible in Ray worker output like its own

_PPOTrainer = PPOTrainer.__ray_metadata__.modified_class  # Ray actor classes cannot be subclassed directly

NO_CORRECT_ROLLOUT_WINDOW = 5  # steps without a single verified-correct rollout before the warning


def rm_actors(group) -> list:
    """The RM group's rank actors, in rank order (OpenRLHF's RayActorGroup keeps them in `_actor_handlers`)."""
    return group._actor_handlers


class CooperPPOTrainer(_PPOTrainer):
    """PPOTrainer whose `train_step` is Cooper's step (module docstring). Created through `CooperTrainer.remote`.

    reward_model_group: the `TrainableRewardModelActor` RayActorGroup (None for the rule arm without an RM).
    pair_actor: the `PairConstructionActor` handle (verifier pool + assistant).
    The remaining arguments are PPOTrainer's.
    """

    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, pair_actor=None, **generate_kwargs):
        # The base trainer builds the prompt dataloader. Outside torch.distributed (this trainer process) its
        # RandomSampler seeds itself from torch's global RNG, which nothing seeds here, so one --train.seed gave
        # every run its own prompt order (seen in the lab: the same arm and seed drew other step-1 prompts in
        # each run). Seeded, a seed is one prompt order, the same in every arm. Upstream: OpenRLHF PR #1355
        # (open) seeds that sampler from the strategy's seed; this line goes once it is in a release we pin.
        torch.manual_seed(strategy.args.train.seed)
        # The base trainer gets no reward group: its experience maker must never run a frozen RM forward
        # (it raises if a sample reaches it without rewards).
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, None, reference_model_group,
                         vllm_engines, **generate_kwargs)
        self.init_cooper(reward_model_group, pair_actor, prompt_question_map(self.args, strategy, self.tokenizer))

    def init_cooper(self, reward_model_group, pair_actor, questions: dict[str, str]) -> None:
        """Cooper's part of the trainer's state, on top of an initialised PPOTrainer (args, groups, engines)."""
        if pair_actor is None:
            raise ValueError("CooperTrainer needs the pair-construction actor (verification runs every step)")
        self.rm_group = reward_model_group
        self.pair_actor = pair_actor
        self.cooper = self.args.cooper
        self.rm_trainable = bool(self.args.remote_rm_trainable)
        if (self.rm_trainable or self.cooper.reward_source == "rm") and reward_model_group is None:
            raise ValueError("the RM arm needs a reward-model group")
        self.reward_form = get_reward_form(self.cooper.reward_form)
        self.questions = questions
        # Overlap needs the RM and the engines on devices of their own, with live DeepSpeed states.
        self.overlap = not (self.args.train.colocate_all or self.args.ds.enable_sleep)
        self.sleeping_engines = bool(self.args.vllm.enable_sleep) and self.cooper.assistant == "policy"
        self.steps_without_correct = 0
        self.sample_log_dir = self.cooper.sample_log_dir
        if self.sample_log_dir:
            os.makedirs(self.sample_log_dir, exist_ok=True)
        self._step: dict = {}  # the step in flight: pending pairs, metrics, timeline, RM update refs
        self.latest_eval: dict = {}  # the last held-out evaluation's logs, not yet seen by the hacking monitor
        self.hacking = HackingMonitor(HackingMonitorConfig.from_namespace(self.cooper))
        self.reward_from_rule = False  # --cooper.on_hacking rule_reward, once the alarm has fired
        self.stop_for_hacking = False  # --cooper.on_hacking stop: checkpoint this step, then end the run
        self.offline_pairs = None  # --cooper.offline_pairs: the RM's pairs come from a file (algo/offline_pairs.py)
        if getattr(self.cooper, "offline_pairs", None):
            from cooper_openrlhf.algo.offline_pairs import load_offline_pairs

            self.offline_pairs = load_offline_pairs(self.cooper.offline_pairs)
        self.rm_eval_rows = []
        if self.cooper.rm_eval_dataset:
            from cooper_openrlhf.data.benchmarks import load_benchmark

            self.rm_eval_rows = load_benchmark("verifybench", self.cooper.rm_eval_dataset).records

    def get_rollout_steps(self) -> int:
        """Rollout steps of the run (what the RM's schedule spans): prompt batches per episode x episodes."""
        prompts = len(self.prompts_dataloader)  # OpenRLHF's prompt loader yields one prompt per item
        return math.ceil(prompts / self.args.rollout.batch_size) * self.args.train.num_episodes

    # ------------------------------------------------------------------------------------ the step
    def train_step(self, rollout_samples, global_step: int):
        """One Cooper step (module docstring); returns OpenRLHF's (status, next global step) with Cooper's metrics."""
        metrics: dict = {}
        timeline = StepTimeline()
        with timeline.stage(metrics, "decode"):
            texts = self.decode_rollouts(rollout_samples)
        with timeline.stage(metrics, "verify"):
            verdicts = self.verify(texts, metrics)
        pending = self.request_negatives(texts, verdicts, global_step, metrics)  # rewrites start on the engines
        if not self.overlap:
            self.collect_rewrites(pending, metrics, timeline)
        with timeline.stage(metrics, "score"):
            rewards, rm_scores = self.score(rollout_samples, texts, verdicts, metrics)
        self._step = {"pending": pending, "rm_scores": rm_scores, "metrics": metrics, "timeline": timeline,
                      "policy_started_at": time.perf_counter()}
        status, next_step = super().train_step(rollout_samples, global_step)  # policy: GRPO + weight sync
        pairs = self._step.get("pairs")
        if pairs is None and pending is not None:  # the policy did not train this step (frozen actor)
            pairs = self.pairs_of(pending, rm_scores, metrics, timeline)
        with timeline.stage(metrics, "rm_update"):
            self.finish_rm_update(pairs, self._step.get("rm_refs"), metrics, timeline)
        if self.rm_eval_rows and next_step % self.args.eval.steps == 0:
            metrics["cooper/rm_eval_accuracy"] = self.rm_eval_accuracy()  # the RM after this step's update
        self.log_samples(next_step, texts, verdicts.correct, rewards, pairs)
        status.update(metrics)
        status.update(timeline.metrics())
        status.update(self.watch_for_hacking(next_step, status))
        self._step = {}
        return status, next_step

    def decode_rollouts(self, samples) -> RolloutTexts:
        """Raw question, reference and completion text of every rollout, in batch order."""
        questions, references, completions = [], [], []
        for sample in samples:
            prompt = sample.prompts[0]
            if prompt not in self.questions:
                raise KeyError(f"rollout prompt not found in --data.prompt_dataset or --eval.dataset (cannot recover "
                               f"its raw question): {prompt[:200]!r}")
            questions.append(self.questions[prompt])
            references.append(str(sample.labels[0]))
            completions.append(self._completion(sample))
        return RolloutTexts(questions, references, completions)

    def verify(self, texts: RolloutTexts, metrics: dict):
        """Rule-verifier verdicts (`RolloutVerdicts`: correct / proved wrong) for every rollout."""
        verdicts, verify_metrics = ray.get(self.pair_actor.verify.remote(texts.references, texts.completions))
        metrics.update({k: v for k, v in verify_metrics.items() if not k.startswith("timing/")})
        self.warn_if_nothing_verifies(metrics["cooper/verified_accuracy"])
        return verdicts

    def warn_if_nothing_verifies(self, accuracy: float) -> None:
        """A window of steps without one verified-correct rollout almost always means bad references or
        answers the verifier cannot find, not a hard task: say so while the run can still be stopped."""
        self.steps_without_correct = self.steps_without_correct + 1 if accuracy == 0 else 0
        if self.steps_without_correct == NO_CORRECT_ROLLOUT_WINDOW:
            logger.warning(
                "no rollout was verified correct in the last %d steps: Cooper has no positives and the rule reward is 0. "
                "Likely causes: --data.label_key holds whole solutions instead of final answers; the policy never "
                "states a final answer (\\boxed{}, 'the answer is'; see --cooper.answer_fallback and the answer-format "
                "instruction in the prompts); --rollout.max_new_tokens cuts answers off.", NO_CORRECT_ROLLOUT_WINDOW)

    # ------------------------------------------------------------------------------- negatives
    def request_negatives(self, texts: RolloutTexts, verdicts, global_step: int, metrics: dict) -> PendingPairs | None:
        """Choose the positives and start the assistant's rewrites (a Ray call, not waited for); None without
        --remote_rm_trainable."""
        if not self.rm_trainable:
            return None
        n = self.args.rollout.n_samples_per_prompt
        positive_index = selection.select_positives(verdicts.correct, n)
        has_wrong = selection.has_proven_wrong_rollout(self.negative_candidates(verdicts), n)
        asked = selection.assistant_prompts(positive_index, has_wrong, self.cooper.negative_source)
        if self.offline_pairs is not None:  # the RM's pairs come from the file: no rewrites
            asked = []
        questions = texts.questions[::n]
        positives = [texts.completions[i] if i != NO_POSITIVE else "" for i in positive_index]
        wake = self.sleeping_engines and bool(asked)
        if wake:  # OpenRLHF put them to sleep after the rollouts (module docstring)
            batch_vllm_engine_call(self.vllm_engines, "wake_up")
        metrics["cooper/vllm_wake_sleep_pairs"] = float(wake)
        rewrites = self.pair_actor.assistant_negatives.remote(questions, positives, asked, step=global_step)
        return PendingPairs(texts, verdicts, positive_index, has_wrong, rewrites, time.perf_counter(), global_step, wake)

    def collect_rewrites(self, pending: PendingPairs | None, metrics: dict, timeline: StepTimeline) -> None:
        """Wait for the assistant's rewrites (then put sleeping engines back to sleep)."""
        if pending is None or not isinstance(pending.rewrites, ray.ObjectRef):
            return
        try:
            rewrites, rewrite_metrics = ray.get(pending.rewrites)
        finally:
            if pending.woke_engines:
                batch_vllm_engine_call(self.vllm_engines, "sleep")
        pending.rewrites = rewrites
        # The assistant's own time; a timing/* key (summed into OpenRLHF's step total) only when nothing overlaps it.
        seconds = rewrite_metrics.pop("timing/cooper_negatives")
        metrics["cooper/negatives_seconds"] = seconds
        if not self.overlap:
            metrics["timing/cooper_negatives"] = seconds
        timeline.record("negatives", pending.requested_at, pending.requested_at + seconds)
        metrics.update(rewrite_metrics)

    def pairs_of(self, pending: PendingPairs, rm_scores: torch.Tensor | None, metrics: dict,
                 timeline: StepTimeline) -> PairBatch:
        """The step's PairBatch: rewrites collected, rollout negatives picked with the RM's scores (`algo.selection`)."""
        self.collect_rewrites(pending, metrics, timeline)
        if self.offline_pairs is not None:
            from cooper_openrlhf.algo.offline_pairs import offline_batch

            pairs = offline_batch(self.offline_pairs, pending.step)
            metrics["cooper/offline_pairs"] = float(pairs.num_valid)
            return pairs
        n, source = self.args.rollout.n_samples_per_prompt, self.cooper.negative_source
        rollout_negative = [selection.NO_ROLLOUT] * len(pending.positive_index)
        if source != "assistant":
            scores = None if rm_scores is None else rm_scores.tolist()
            rollout_negative = selection.select_rollout_negatives(
                self.negative_candidates(pending.verdicts), n, scores, self.cooper.rollout_negative_pick,
                seed=self.args.train.seed + pending.step)
        texts = pending.texts
        pairs = selection.assemble_pairs(texts.questions[::n], texts.references[::n], texts.completions,
                                         pending.positive_index, rollout_negative, pending.rewrites, source)
        metrics.update(selection.pair_metrics(pairs, pending.has_wrong_rollout))
        answerless_pairs = sum(ok and kind == selection.FROM_ROLLOUT and pending.verdicts.answerless[i]
                               for ok, kind, i in zip(pairs.valid, pairs.negative_source, rollout_negative))
        metrics["cooper/pairs_answerless_negative"] = answerless_pairs / pairs.num_valid if pairs.num_valid else 0.0
        return pairs

    def negative_candidates(self, verdicts) -> list[bool]:
        """Which rollouts may be a rollout negative: proved wrong, and answerless ones with --cooper.answerless_negatives."""
        return selection.rollout_negative_candidates(verdicts.proven_wrong, verdicts.answerless,
                                                     self.cooper.answerless_negatives)

    def watch_for_hacking(self, step: int, status: dict) -> dict[str, float]:
        """Feed the step (and the latest held-out evaluation) to the reward-hacking rule (`algo.hacking`); when its
        alarm turns on, do what --cooper.on_hacking says. Returns the `cooper/hacking_*` metrics to log."""
        was_on = self.hacking.alarm_on
        logged = guard_step(self.hacking, step, status, self.latest_eval)  # logs the reasons when it turns on
        self.latest_eval = {}
        if logged["cooper/hacking_alarm"] and not was_on:
            if self.cooper.on_hacking == "stop":
                self.stop_for_hacking = True  # save_logs_and_checkpoints saves this step, then raises
            elif self.cooper.on_hacking == "rule_reward" and not self.reward_from_rule:
                self.reward_from_rule = True
                logger.warning("--cooper.on_hacking rule_reward: the policy's reward is the rule verifier's from step "
                               "%d on (the RM is still scored, logged and, with --remote_rm_trainable, trained)", step + 1)
        logged["cooper/reward_from_rule"] = float(self.reward_from_rule)
        return logged

    # ---------------------------------------------------------------------------------- scoring
    def score(self, samples, texts: RolloutTexts, verdicts, metrics: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Set each sample's reward (RM reward form, or the rule reward); returns the (B,) rewards and RM logits."""
        verified = verdicts.correct
        accuracy = sum(verified) / len(verified)
        metrics["cooper/verified_accuracy"] = accuracy
        rewards = rule_reward(verified)
        logits = None
        if self.rm_group is not None:
            logits = self.rm_logits(texts)
            rm_rewards = self.rm_rewards(logits, verdicts.answerless)
            metrics["cooper/rm_reward_mean"] = rm_rewards.mean().item()
            metrics["cooper/reward_hacking_gap"] = metrics["cooper/rm_reward_mean"] - accuracy
            metrics.update({f"cooper/{k}": v for k, v in rm_reward_by_verdict(verified, rm_rewards.tolist()).items()})
            if self.cooper.reward_source == "rm" and not self.reward_from_rule:
                rewards = rm_rewards
        for sample, reward in zip(samples, rewards):
            sample.rewards = reward.reshape(1).clone()
            sample.info["reward"] = reward.reshape(1).clone()
        return rewards, logits

    def rm_rewards(self, logits: torch.Tensor, answerless) -> torch.Tensor:
        """What the RM pays each rollout: the reward form of its logit, 0 for answerless text with
        --cooper.require_answer. Training and held-out rollouts alike, so every RM metric is what the policy is paid."""
        rewards = self.reward_form(logits, self.cooper.reward_threshold)
        return gate_answerless(rewards, answerless) if self.cooper.require_answer else rewards

    def rm_logits(self, texts: RolloutTexts) -> torch.Tensor:
        """(B,) RM logits of the normalised completions, the batch split evenly over the RM ranks."""
        completions = [normalize_solution(text) for text in texts.completions]
        actors = rm_actors(self.rm_group)
        refs = [actor.score.remote(texts.questions[part], texts.references[part], completions[part])
                for actor, part in zip(actors, even_slices(len(completions), len(actors)))]
        return torch.tensor([logit for chunk in ray.get(refs) for logit in chunk], dtype=torch.float32)

    # ------------------------------------------------------------------------------- RM update
    def ppo_train(self, global_steps: int):
        """OpenRLHF's policy update; meanwhile the step's pairs are collected and, when overlapping, the RM update
        is launched beside it (from this actor's second thread: both only wait on other actors)."""
        step = self._step
        start = time.perf_counter()
        if step:
            step["timeline"].record("make_experience", step["policy_started_at"], start)
        if not step.get("pending"):
            status = self._policy_fit(global_steps)
        else:
            with ThreadPoolExecutor(max_workers=1) as policy_thread:
                policy = policy_thread.submit(self._policy_fit, global_steps)
                step["pairs"] = self.pairs_of(step["pending"], step["rm_scores"], step["metrics"], step["timeline"])
                if self.overlap:
                    step["rm_refs"] = self.launch_rm_update(step["pairs"])
                    step["rm_launched_at"] = time.perf_counter()
                status = policy.result()
        if step:
            step["timeline"].record("ppo_train", start, time.perf_counter())
        return status

    def _policy_fit(self, global_steps: int):
        start = time.perf_counter()
        status = _PPOTrainer.ppo_train(self, global_steps)
        if self._step:
            self._step["timeline"].record("policy_fit", start, time.perf_counter())
        return status

    def finish_rm_update(self, pairs: PairBatch | None, refs, metrics: dict, timeline: StepTimeline) -> None:
        """Wait for (or, serially, run reload -> fit -> offload) the RM update and merge its metrics."""
        if pairs is None:
            return
        sleeping = self.args.ds.enable_sleep  # the RM's states are offloaded between updates (reward_actor)
        if refs is None:
            if sleeping:
                ray.get(self.rm_group.async_run_method(method_name="reload_states"))
            refs = self.launch_rm_update(pairs)
        results = [ray.get(call) for call in refs]
        if sleeping:
            ray.get(self.rm_group.async_run_method(method_name="offload_states"))
        merged = merge_rm_metrics([call_results[0] for call_results in results])  # ranks all-reduce their metrics
        metrics.update(merged)
        if "rm_launched_at" in self._step and "cooper/rm_fit_seconds" in merged:
            launched = self._step["rm_launched_at"]
            timeline.record("rm_fit", launched, launched + merged["cooper/rm_fit_seconds"])

    def launch_rm_update(self, pairs: PairBatch) -> list[list]:
        """Submit the RM update: one `fit` per optimizer-step group (the whole step, or each mini-batch with
        --cooper.rm_update_granularity minibatch); Ray runs an actor's calls in submission order."""
        trainable = pairs.valid_only()
        actors = rm_actors(self.rm_group)
        if self.cooper.rm_update_granularity == "step" or not trainable.num_valid:
            batches = [trainable]
        else:
            size = self.cooper.rm_mini_batch_size
            batches = [trainable.select(range(i, min(i + size, len(trainable)))) for i in range(0, len(trainable), size)]
        return [[actor.fit.remote(part, batch.num_valid) for actor, part in zip(actors, batch.split(len(actors)))]
                for batch in batches]

    # ------------------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, global_step, **generate_kwargs):
        """Held-out accuracy every --eval.steps steps: OpenRLHF samples --eval.dataset on the same vLLM engines and
        computes its pass@1 / pass@n; the rewards it scores are the rule verifier's verdicts (stock evaluation
        needs a remote RM). Logged through OpenRLHF's logger as `eval/<datasource>/accuracy` (= pass@1) and
        `eval/accuracy` (over all held-out prompts), beside the stock `eval/eval_<datasource>_pass*` keys. RM arms
        also score the held-out rollouts with the current RM: `eval/rm_reward`, `eval/reward_hacking_gap` and its
        standard error (the hacking rule's E)."""
        start = time.perf_counter()
        samples = self.samples_generator.generate_eval_samples(**generate_kwargs)
        logs = {}
        if samples:
            texts = self.decode_rollouts(samples)
            verdicts, _ = ray.get(self.pair_actor.verify.remote(texts.references, texts.completions))
            for sample, correct in zip(samples, verdicts.correct):
                sample.rewards = [float(correct)]
            logs = compute_eval_metrics(self.eval_dataloader, samples, generate_kwargs["n_samples_per_prompt"])
            logs.update({f"{key[len('eval_'):-len('_pass1')]}/accuracy": value for key, value in list(logs.items())
                         if key.startswith("eval_") and key.endswith("_pass1")})
            logs["accuracy"] = sum(verdicts.correct) / len(verdicts.correct)
            logs["samples"] = float(len(verdicts.correct))  # the hacking rule's noise scale (algo/hacking.py, rule C)
            rm_rewards = None
            if self.rm_group is not None:  # what the RM pays on prompts the policy never trains on (rule E)
                rm_rewards = self.rm_rewards(self.rm_logits(texts), verdicts.answerless).tolist()
                logs.update(heldout_rm_gap(texts.questions, verdicts.correct, rm_rewards))
            if self.sample_log_dir:  # the held-out rollouts and what the RM paid them (None: the rule arm)
                append_jsonl(os.path.join(self.sample_log_dir, "heldout.jsonl"),
                             rollout_rows(global_step, texts, verdicts.correct, rm_rewards))
            logs["seconds"] = time.perf_counter() - start
        self.latest_eval = logs
        for tracker in (self.wandb_logger, self.tensorboard_logger):
            if tracker:
                tracker.log_eval(global_step, logs)
        logger.info("held-out evaluation at step %d: %s", global_step,
                    {k: round(v, 4) for k, v in logs.items() if k.endswith("accuracy")})
        return logs

    def _completion(self, sample) -> str:
        response = sample.sequences[0][1:][sample.action_mask[0].bool()]  # action_mask is aligned to sequences[1:]
        return self.tokenizer.decode(response, skip_special_tokens=True)

    def rm_eval_accuracy(self) -> float:
        """The RM's accuracy on --cooper.rm_eval_dataset (VerifyBench rows: reward >= 0.5 <=> gold_correct): the
        paper's check that the co-trained RM stays a good verifier."""
        rows = self.rm_eval_rows
        texts = RolloutTexts([r.question for r in rows], [r.reference for r in rows], [r.completion for r in rows])
        predicted = torch.sigmoid(self.rm_logits(texts)) >= 0.5
        return sum(bool(p) == r.gold_correct for p, r in zip(predicted.tolist(), rows)) / len(rows)

    # -------------------------------------------------------------------------------- logging
    def broadcast_to_vllm(self) -> None:
        """OpenRLHF's weight sync, timed on the step's timeline."""
        start = time.perf_counter()
        super().broadcast_to_vllm()
        if self._step:
            self._step["timeline"].record("broadcast", start, time.perf_counter())

    def log_samples(self, step: int, texts: RolloutTexts, verified, rewards, pairs: PairBatch | None) -> None:
        """With --cooper.sample_log_dir: append the step's rollouts and pairs as JSON lines."""
        if not self.sample_log_dir:
            return
        append_jsonl(os.path.join(self.sample_log_dir, "rollouts.jsonl"),
                     rollout_rows(step, texts, verified, rewards.tolist()))
        if pairs is not None:
            rows = [
                {"step": step, "question": q, "reference": r, "positive": p, "negative": n, "valid": v,
                 "positive_index": i, "negative_source": k}
                for q, r, p, n, v, i, k in zip(pairs.questions, pairs.references, pairs.positives, pairs.negatives,
                                               pairs.valid, pairs.positive_index, pairs.negative_source)
            ]
            append_jsonl(os.path.join(self.sample_log_dir, "pairs.jsonl"), rows)

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
        """OpenRLHF's logging and policy checkpoint, with the RM checkpoint saved alongside under the same tag; after
        a hacking alarm with --cooper.on_hacking stop, this step's checkpoint is saved whatever --ckpt.save_steps
        says, and the run ends with `HackingAlarm`."""
        stopping = self.stop_for_hacking
        save_steps = self.args.ckpt.save_steps
        if stopping:
            self.args.ckpt.save_steps = 1
        try:
            rm_refs = []
            if self.rm_trainable and global_step % self.args.ckpt.save_steps == 0:
                rm_refs = self.rm_group.async_run_method(method_name="save_checkpoint", tag=f"global_step{global_step}",
                                                         client_states=dict(client_states or {}))
            super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
            ray.get(rm_refs)
        finally:
            self.args.ckpt.save_steps = save_steps
        if stopping:
            raise HackingAlarm(f"reward hacking suspected at step {global_step} (reasons in the log above); "
                               f"--cooper.on_hacking stop saved checkpoint global_step{global_step} under "
                               f"{self.args.ckpt.path} and ended the run")


def rollout_rows(step: int, texts: RolloutTexts, verified, rewards: list[float] | None) -> list[dict]:
    """One JSON row per rollout for --cooper.sample_log_dir (rewards None: the run has no RM to score them)."""
    rewards = rewards if rewards is not None else [None] * len(verified)
    return [{"step": step, "question": q, "reference": r, "completion": c, "verified": bool(v),
             "reward": None if w is None else float(w)}
            for q, r, c, v, w in zip(texts.questions, texts.references, texts.completions, verified, rewards)]


CooperTrainer = ray.remote(CooperPPOTrainer)
