"""CooperTrainer: OpenRLHF's PPOTrainer running Cooper's step (arXiv 2508.05613, Algorithm 1).

`CooperPPOTrainer.train_step` reads the step top to bottom; each phase is a method returning its result and its
metrics, timed on the step's `StepClock` (`timing/cooper_<phase>`, `timeline/<phase>_start|_end`):
  decode     rollouts -> (raw question, reference = the prompt's label, completion text)
  verify     the pair-construction actor's rule verifier judges every rollout (correct / proved wrong)
  negatives  the assistant rewrites each prompt's positive on the vLLM engines (--cooper.negative_source
             assistant / mixed), collected on the trainer's second thread
  score      the RM group scores the texts through the VerifyRM template; the rewards are set on the samples,
             so OpenRLHF's experience maker skips its frozen-RM forward
  pairs      on the second thread: `core.finish_pairs` (the RM's scores pick "hardest" rollout negatives)
  policy     `super().train_step`, OpenRLHF's GRPO step unchanged (make_experience, ppo_train, weight sync);
             `broadcast_to_vllm`, the step's one other override, holds the sync until the rewrites are in
             (checkpoints and held-out evaluation: the mixins of ray/checkpoints.py and ray/evaluation.py)
  RM update  masked pairwise loss on the step's valid pairs (only with --remote_rm_trainable), guarded: a version
             whose health on the anchors leaves its bounds is rolled back before it scores (`ray/rm_guard.py`)
  metrics    RM reward next to the rule-verified accuracy of the same rollouts (the reward-hacking gap)

Overlap. With the RM and the engines on devices of their own (no --train.colocate_all, no --ds.enable_sleep) the
rewrites run while the RM scores and the actor makes experience, and the RM update runs on the second thread beside
the policy update. Colocated (or with sleeping DeepSpeed states) the step waits for the rewrites right after asking,
and runs the RM update after the policy update as OpenRLHF's reload -> fit -> offload. Either way the rewards of step
t come from the RM before its update at step t (scoring reaches the RM actors first), and step t+1 is scored by the
updated RM, as in the paper.

How it departs from the paper and its official recipe:
- Negatives are requested right after verification, not after the policy update; they depend only on
  the step's rollouts, so nothing changes but the time. The default assistant is the policy itself on
  its own engines; the paper's separate assistant model is `--cooper.assistant model`. With
  --vllm.enable_sleep OpenRLHF puts the engines to sleep after generating the rollouts, so a step with
  rewrites adds one wake_up/sleep pair (`cooper/vllm_wake_sleep_pairs`).
- A negative counts only when the rule verifier proves its answer differs; positives are the first
  verified-correct rollout in batch order (the recipe iterated a set); both sides of a pair, and every
  completion the RM scores, go through the same `normalize_solution` (the RM template applies it); prompts
  without a pair are masked out and counted, never dropped silently; non-finite RM steps are skipped.
- The RM reads (raw question, reference, completion) text, never the policy's chat-templated prompt: the
  raw question is recovered from the dataset (`prompt_question_map`) and a prompt it cannot recover fails.
Beside the step, in files of their own: the policy and the RM checkpointed as one unit (`ray/checkpoints.py`),
and held-out evaluation graded by the rule verifier and scored by the RM (`ray/evaluation.py`); the step's records
(texts, pending pairs, clock, sample logs) in `ray/step_records.py`.

And from stock OpenRLHF: `--train.seed` fixes the prompt order (stock leaves the trainer's prompt sampler seeded
from an unseeded RNG, so each run drew its own order and the arms of one seed trained on different problems).
"""

import math
import os
from concurrent.futures import Future, ThreadPoolExecutor

import ray
import torch
from openrlhf.trainer.ppo_trainer import PPOTrainer
from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call
from openrlhf.utils.logging_utils import init_logger

from cooper_openrlhf.algo.hacking import HackingMonitorConfig
from cooper_openrlhf.algo.pairs import PairBatch
from cooper_openrlhf.core import (HackingResponse, PairConfig, PayConfig, RolloutTexts, RolloutVerdicts, finish_pairs,
                                  plan_pairs, rewards)
from cooper_openrlhf.core.pay import reward_metrics
from cooper_openrlhf.core.step_pairs import rewrite_request
from cooper_openrlhf.ray.checkpoints import CheckpointUnit
from cooper_openrlhf.ray.evaluation import HeldOutEvaluation
from cooper_openrlhf.ray.rm_guard import RMGuarding
from cooper_openrlhf.ray.rm_scoring import RMScoring
from cooper_openrlhf.ray.step_records import (
    PendingPairs,
    StepClock,
    StepState,
    append_jsonl,
    heldout_problems,
    merge_rm_metrics,
    pair_rows,
    prompt_question_map,
    rollout_rows,
)
from cooper_openrlhf.ray.trainer_state import rank_actors, undecorated

logger = init_logger(__name__)  # OpenRLHF's logger: visible in Ray worker output like its own

_PPOTrainer = undecorated(PPOTrainer)  # Ray actor classes cannot be subclassed directly

NO_CORRECT_ROLLOUT_WINDOW = 5  # steps without a single verified-correct rollout before the warning


class CooperPPOTrainer(RMGuarding, CheckpointUnit, HeldOutEvaluation, RMScoring, _PPOTrainer):
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
        self.pay = PayConfig.from_flags(self.cooper)
        self.pair_config = PairConfig(self.args.rollout.n_samples_per_prompt, self.cooper.negative_source,
                                      self.cooper.rollout_negative_pick, bool(self.cooper.answerless_negatives),
                                      seed=self.args.train.seed)
        self.questions = questions
        # Overlap needs the RM and the engines on devices of their own, with live DeepSpeed states.
        self.overlap = not (self.args.train.colocate_all or self.args.ds.enable_sleep)
        self.sleeping_engines = bool(self.args.vllm.enable_sleep) and self.cooper.assistant == "policy"
        self.steps_without_correct = 0
        self.sample_log_dir = self.cooper.sample_log_dir
        if self.sample_log_dir:
            os.makedirs(self.sample_log_dir, exist_ok=True)
        # The second thread: the rewrites' collection, the pair assembly and (overlapped) the RM update run on it,
        # beside the step; they only wait on other actors.
        self.beside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cooper-beside")
        self.step: StepState | None = None  # the step in flight, for broadcast_to_vllm inside OpenRLHF's train_step
        self.latest_eval: dict = {}  # the last held-out evaluation's logs, not yet seen by the hacking monitor
        # --cooper.on_hacking: `paying_rule` once rule_reward was taken; `stop` checkpoints the step, then ends the run
        self.hacking = HackingResponse(HackingMonitorConfig.from_namespace(self.cooper), self.cooper.on_hacking)
        self.offline_pairs = None  # --cooper.offline_pairs: the RM's pairs come from a file (algo/offline_pairs.py)
        if getattr(self.cooper, "offline_pairs", None):
            from cooper_openrlhf.algo.offline_pairs import load_offline_pairs

            self.offline_pairs = load_offline_pairs(self.cooper.offline_pairs)
        self.rm_eval_rows = []
        if self.cooper.rm_eval_dataset:
            from cooper_openrlhf.data.benchmarks import load_benchmark

            self.rm_eval_rows = load_benchmark("verifybench", self.cooper.rm_eval_dataset).records
        heldout = heldout_problems(self.args, self.strategy)
        self.init_probes(heldout)
        self.init_rm_guard(heldout)  # --cooper.rm_guard: the anchors read after every RM update

    def get_rollout_steps(self) -> int:
        """Rollout steps of the run (what the RM's schedule spans): prompt batches per episode x episodes."""
        prompts = len(self.prompts_dataloader)  # OpenRLHF's prompt loader yields one prompt per item
        return math.ceil(prompts / self.args.rollout.batch_size) * self.args.train.num_episodes

    # ------------------------------------------------------------------------------------ the step
    def train_step(self, rollout_samples, global_step: int):
        """One Cooper step (module docstring); returns OpenRLHF's (status, next global step) with Cooper's metrics."""
        clock = StepClock()
        with clock.stage("decode"):
            texts = self.decode_rollouts(rollout_samples)
        with clock.stage("verify"):
            verdicts, verify_metrics = self.verify(texts)
        # Negatives: the rewrites start on the engines while they are awake; the second thread collects them.
        pending = self.request_negatives(texts, verdicts, global_step, clock)
        if pending is not None and not self.overlap:  # colocated: the engines sleep again before the RM's turn
            with clock.stage("negatives"):
                pending.rewrites.result()
        with clock.stage("score"):  # step t's rewards: the RM before its update at step t
            rewards, rm_logits, score_metrics = self.score(rollout_samples, texts, verdicts)
        # The pairs are assembled beside OpenRLHF's step; an RM on devices of its own trains beside the policy too.
        pairs = self.beside.submit(self.pairs_of, pending, rm_logits)
        rm_update = self.beside.submit(self.update_rm, pairs, global_step) if self.overlap else None
        # Policy: OpenRLHF's step unchanged (experience, GRPO update, weight sync); the sync waits for the rewrites.
        self.step = StepState(clock, pending.rewrites if pending else None)
        status, next_step = super().train_step(rollout_samples, global_step)
        self.step = None
        with clock.stage("rm_update"):  # colocated: OpenRLHF's reload -> fit -> offload, after the policy's update
            rm_metrics = rm_update.result() if rm_update else self.update_rm(pairs, global_step)
        pairs, pair_metrics = pairs.result()
        if self.args.eval.steps > 0 and next_step % self.args.eval.steps == 0:  # the RM after this step's update
            with clock.stage("rm_read"):  # an RM arm's evaluation steps are long for this read: timed, so it shows
                rm_metrics.update(self.read_rm())
        self.log_samples(next_step, texts, verdicts.correct, rewards, pairs)
        status.update({**verify_metrics, **score_metrics, **pair_metrics, **rm_metrics, **clock.metrics()})
        status.update(self.watch_for_hacking(next_step, status))
        return status, next_step

    def read_rm(self) -> dict[str, float]:
        """The RM read at an evaluation step: its verifier accuracy (--cooper.rm_eval_dataset) and what it pays the
        probe suite's attack forms (--cooper.probe_prompts, `rm/probes.py`)."""
        metrics = self.probe_rm()
        if self.rm_eval_rows:
            metrics["cooper/rm_eval_accuracy"] = self.rm_eval_accuracy()
        return metrics

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
            response = sample.sequences[0][1:][sample.action_mask[0].bool()]  # action_mask is aligned to sequences[1:]
            completions.append(self.tokenizer.decode(response, skip_special_tokens=True))
        return RolloutTexts(questions, references, completions)

    def verify(self, texts: RolloutTexts) -> tuple[RolloutVerdicts, dict[str, float]]:
        """Rule-verifier verdicts (correct / proved wrong / answerless) for every rollout, and their metrics."""
        verdicts, metrics = ray.get(self.pair_actor.verify.remote(texts.references, texts.completions))
        metrics = {k: v for k, v in metrics.items() if not k.startswith("timing/")}  # the step's clock times it
        self.warn_if_nothing_verifies(metrics["cooper/verified_accuracy"])
        return verdicts, metrics

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
    def request_negatives(self, texts: RolloutTexts, verdicts, global_step: int, clock: StepClock) -> PendingPairs | None:
        """Plan the step's pairs (`core.plan_pairs`) and start the assistant's rewrites on the engines, collected on
        the second thread; None without --remote_rm_trainable."""
        if not self.rm_trainable:
            return None
        plan = plan_pairs(self.pair_config, verdicts)
        request = rewrite_request(self.pair_config, plan, texts)
        # The offline_pairs control's pairs come from its file, not from rewrites of this step's positives.
        asked = [] if self.offline_pairs is not None else request.prompts
        wake = self.sleeping_engines and bool(asked)
        if wake:  # OpenRLHF put them to sleep after the rollouts (module docstring)
            batch_vllm_engine_call(self.vllm_engines, "wake_up")
        ref = self.pair_actor.assistant_negatives.remote(request.questions, request.positives, asked, step=global_step)
        return PendingPairs(texts, plan, self.beside.submit(self.collect_rewrites, ref, wake, clock), global_step)

    def collect_rewrites(self, ref, woke_engines: bool, clock: StepClock) -> tuple[dict[int, str], dict[str, float]]:
        """Wait for the assistant's rewrites (then put woken engines back to sleep); the rewrites and their metrics."""
        try:
            with clock.stage("rewrites", timing_key=False):  # the step's wait for them is the "negatives" stage
                rewrites, metrics = ray.get(ref)
        finally:
            if woke_engines:
                batch_vllm_engine_call(self.vllm_engines, "sleep")
        metrics["cooper/negatives_seconds"] = metrics.pop("timing/cooper_negatives")  # the assistant's own time
        metrics["cooper/vllm_wake_sleep_pairs"] = float(woke_engines)
        return rewrites, metrics

    def pairs_of(self, pending: PendingPairs | None, rm_logits: torch.Tensor | None) -> tuple[PairBatch | None, dict]:
        """The step's PairBatch (None without --remote_rm_trainable) and metrics: the rewrites, then
        `core.finish_pairs` (rollout negatives picked with the RM's scores)."""
        if pending is None:
            return None, {}
        rewrites, metrics = pending.rewrites.result()
        if self.offline_pairs is not None:  # the control arm: fresh pairs of the pair stage's kind, not the policy's
            from cooper_openrlhf.algo.offline_pairs import offline_batch

            pairs = offline_batch(self.offline_pairs, pending.step)
            return pairs, {**metrics, "cooper/offline_pairs": float(pairs.num_valid)}
        pairs, pair_metrics = finish_pairs(self.pair_config, pending.plan, pending.texts, rewrites,
                                           None if rm_logits is None else rm_logits.tolist(), pending.step)
        return pairs, {**metrics, **pair_metrics}

    def watch_for_hacking(self, step: int, status: dict) -> dict[str, float]:
        """Feed the step (and the latest held-out evaluation) to the hacking response (`core.HackingResponse`), which
        does what --cooper.on_hacking says when the alarm turns on. Returns the `cooper/hacking_*` metrics to log."""
        logged = self.hacking.watch(step, status, self.latest_eval)
        self.latest_eval = {}
        return logged

    # ---------------------------------------------------------------------------------- scoring
    def score(self, samples, texts: RolloutTexts, verdicts: RolloutVerdicts) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                                    dict]:
        """Set each sample's reward (`core.pay`: the RM's in the configured form, or the rule's); returns the (B,)
        rewards, the (B,) RM logits (None without an RM) and the reward metrics."""
        logits = self.rm_logits(texts) if self.rm_group is not None else None
        paid = rewards(self.pay, verdicts, logits, paying_rule=self.hacking.paying_rule)
        for sample, reward in zip(samples, paid.paid):
            sample.rewards = reward.reshape(1).clone()
            sample.info["reward"] = reward.reshape(1).clone()
        return paid.paid, logits, reward_metrics(verdicts, paid.rm)

    # ------------------------------------------------------------------------------- RM update
    def update_rm(self, pairs: Future, step: int = 0) -> dict[str, float]:
        """The RM's masked pairwise update on the step's valid pairs (`pairs`: `pairs_of`'s job), as OpenRLHF's
        reload -> fit -> offload when its DeepSpeed states sleep between updates, inside the RM guard
        (`ray/rm_guard.py`: a version out of bounds is rolled back here, before any step is scored by it); returns
        the merged RM metrics. One `fit` per optimizer-step group (the whole step, or each mini-batch with
        --cooper.rm_update_granularity minibatch); Ray runs an actor's calls in submission order."""
        pairs, _ = pairs.result()
        if pairs is None:
            return {}
        trainable, actors, size = pairs.valid_only(), rank_actors(self.rm_group), self.cooper.rm_mini_batch_size
        batches = [trainable]
        if self.cooper.rm_update_granularity == "minibatch" and trainable.num_valid:
            batches = [trainable.select(range(i, min(i + size, len(trainable)))) for i in range(0, len(trainable), size)]
        skipped = self.guard_before_update(step) if trainable.num_valid else None
        if skipped is not None:
            return skipped
        sleeping = self.args.ds.enable_sleep  # the RM's states are offloaded between updates (reward_actor)
        if sleeping:
            ray.get(self.rm_group.async_run_method(method_name="reload_states"))
        anchors, weight = self.anchor_shares(step, len(actors))
        calls = [[actor.fit.remote(part, batch.num_valid, *((rows, weight) if weight else ()))
                  for actor, part, rows in zip(actors, batch.split(len(actors)), anchors)] for batch in batches]
        results = [ray.get(call) for call in calls]
        metrics = merge_rm_metrics([rank_results[0] for rank_results in results])  # ranks all-reduce their metrics
        if trainable.num_valid:
            metrics.update(self.guard_after_update(step, bool(metrics.get("cooper/rm_updated"))))
        if sleeping:
            ray.get(self.rm_group.async_run_method(method_name="offload_states"))
        if self.args.train.colocate_all:
            # As after scoring (`rm_logits`): the update's cached blocks go back to the shared GPUs before the
            # engines wake for the next step's rollouts.
            ray.get(self.rm_group.async_run_method(method_name="empty_cache"))
        return metrics

    # ------------------------------------------------------------------------ weight sync, logging
    def broadcast_to_vllm(self) -> None:
        """OpenRLHF's weight sync, once the step's rewrites are in: the engines write them with the policy of the
        step's rollouts, and new weights in mid-request would mix two policies into one rewrite."""
        step = self.step
        if step is None:  # OpenRLHF's fit syncs once before its loop when it resumes
            return super().broadcast_to_vllm()
        if step.rewrites is not None:
            step.rewrites.result()
        with step.clock.stage("broadcast", timing_key=False):  # its own time: OpenRLHF's timing/broadcast has the wait
            super().broadcast_to_vllm()

    def log_samples(self, step: int, texts: RolloutTexts, verified, rewards, pairs: PairBatch | None) -> None:
        """With --cooper.sample_log_dir: append the step's rollouts and pairs as JSON lines."""
        if not self.sample_log_dir:
            return
        append_jsonl(os.path.join(self.sample_log_dir, "rollouts.jsonl"),
                     rollout_rows(step, texts, verified, rewards.tolist()))
        if pairs is not None:
            append_jsonl(os.path.join(self.sample_log_dir, "pairs.jsonl"), pair_rows(step, pairs))


CooperTrainer = ray.remote(CooperPPOTrainer)
