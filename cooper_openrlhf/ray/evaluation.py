"""Held-out evaluation of a Cooper run, a mixin of `ray/trainer.CooperPPOTrainer`.

Every --eval.steps steps OpenRLHF samples --eval.dataset on the rollout engines; here the samples are graded by the
rule verifier (stock evaluation needs a remote RM) and, on RM arms, scored by the current RM, so the run logs
what the RM pays on prompts the policy never trains on (the hacking rules heldout_falls and heldout_gap_grows read
it). With --cooper.rm_eval_dataset the RM's own verifier accuracy is logged too, and with --cooper.probe_prompts
what the RM pays the probe suite's attack forms (`rm/probes.py`).
"""

import os
import time
from collections.abc import Callable

import ray
import torch
from openrlhf.trainer.ppo_trainer import compute_eval_metrics
from openrlhf.utils.logging_utils import init_logger

from cooper_openrlhf.algo.hacking_stats import heldout_rm_gap
from cooper_openrlhf.rm.probes import build_probes, probe_metrics, read_pay
from cooper_openrlhf.core import RolloutTexts
from cooper_openrlhf.core.pay import judged_correct
from cooper_openrlhf.ray.step_records import append_jsonl, rollout_rows
from cooper_openrlhf.ray.trainer_state import CooperTrainerState

logger = init_logger(__name__)


class HeldOutEvaluation(CooperTrainerState):
    """Held-out evaluation, the RM's probes and its verifier accuracy (module docstring). Calls the trainer's
    `decode_rollouts` and the RM scoring's `rm_logits` / `rm_rewards` (`ray/rm_scoring.py`)."""

    decode_rollouts: Callable
    rm_logits: Callable
    rm_rewards: Callable

    @torch.no_grad()
    def evaluate(self, global_step, **generate_kwargs):
        """Held-out accuracy every --eval.steps steps: OpenRLHF samples --eval.dataset on the same vLLM engines and
        computes its pass@1 / pass@n; the rewards it scores are the rule verifier's verdicts (stock evaluation
        needs a remote RM). Logged through OpenRLHF's logger as `eval/<datasource>/accuracy` (= pass@1) and
        `eval/accuracy` (over all held-out prompts), beside the stock `eval/eval_<datasource>_pass*` keys. RM arms
        also score the held-out rollouts with the current RM: `eval/rm_reward`, `eval/reward_hacking_gap` and its
        standard error (the hacking rule heldout_gap_grows)."""
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
            if self.rm_group is not None:  # what the RM pays on prompts the policy never trains on (heldout_gap_grows)
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

    def init_probes(self, problems) -> None:
        """The probe suite on the first --cooper.probe_prompts held-out problems with an integer reference (RM arms;
        none without --eval.dataset or with --cooper.probe_prompts 0)."""
        self.probes, self.probes_dropped = [], {}
        limit = getattr(self.cooper, "probe_prompts", 0)
        if self.rm_group is not None and limit > 0 and any(p.reference.strip().lstrip("-").isdigit() for p in problems):
            self.probes, self.probes_dropped = build_probes(problems, limit)

    def probe_rm(self) -> dict[str, float]:
        """cooper/probe_pay/<form> and cooper/probe_premium/<form>: what the RM pays the suite, paid as the policy is
        (`rm_rewards`: the reward form); empty without a suite. A frozen RM's logits are scored once, as in
        `rm_eval_accuracy`; the pay is formed from them each time (the reward form can change after an alarm)."""
        if not self.probes:
            return {}
        logits = getattr(self, "_frozen_probe_logits", None)  # set only when the RM is frozen (scored once)
        if logits is None:
            texts = RolloutTexts([p.question for p in self.probes], [p.reference for p in self.probes],
                                 [p.completion for p in self.probes])
            logits = self.rm_logits(texts)
            if not self.rm_trainable:
                self._frozen_probe_logits = logits
        paid = self.rm_rewards(logits, [False] * len(self.probes)).tolist()  # the gate would hide them
        return probe_metrics(read_pay(self.probes, paid, self.probes_dropped))

    def rm_eval_accuracy(self) -> float:
        """The RM's accuracy on --cooper.rm_eval_dataset (VerifyBench rows: reward >= 0.5 <=> gold_correct): the
        paper's check that the co-trained RM stays a good verifier. A frozen RM (no --remote_rm_trainable) gives
        the same accuracy every time, so it is scored once: on a static arm the set is larger than a step's
        rollouts, and scoring it again at every evaluation cost more than the training steps themselves."""
        frozen = getattr(self, "_frozen_rm_eval_accuracy", None)  # set only when the RM is frozen
        if frozen is not None:
            return frozen
        rows = self.rm_eval_rows
        texts = RolloutTexts([r.question for r in rows], [r.reference for r in rows], [r.completion for r in rows])
        predicted = judged_correct(self.rm_logits(texts))
        accuracy = sum(p == r.gold_correct for p, r in zip(predicted, rows)) / len(rows)
        if not self.rm_trainable:
            self._frozen_rm_eval_accuracy = accuracy
        return accuracy
