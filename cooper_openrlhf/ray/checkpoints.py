"""The policy and the Cooper RM checkpointed as one unit, a mixin of `ray/trainer.CooperPPOTrainer`.

OpenRLHF saves the policy under {ckpt.path}/_actor/<tag> and rotates those checkpoints by eval metric; the RM
saves under {ckpt.path}/_rm/<tag> with the same tag (`reward_actor.save_checkpoint`), after the policy, and then
keeps exactly the tags the policy kept (`keep_policy_tags`), so a best policy is kept with the RM it was trained
against. Once both saves returned the pair is marked whole (`checkpoint_tags.mark_pair_whole`); a resume loads the
newest whole pair (`checkpoint_tags.resume_point`; train_cooper's driver points both `latest` files at it before
the models load), so a preemption at any moment of a save costs the steps since the last whole pair, never the
run. Off --ckpt.save_steps' schedule, the step is checkpointed too when a save was requested
(`ray/save_request.py`: the launcher asks when Slurm warns of the time limit), and after a hacking alarm under
--cooper.on_hacking stop, which then ends the run with `HackingAlarm`. The policy checkpoint's client states also
carry the hacking response's switch (rule_reward taken: PAYING_RULE_STATE), which a resume restores.

The saves run one after the other (policy, RM, marker) rather than side by side: each moment of a save then has
one meaning, and `COOPER_SAVE_MOMENT_HOOK` (a command, run with the moment and the tag: `before_policy_save`,
`before_rm_save`, `before_marker`, `after_marker`) lets a test preempt the job at a chosen one.
"""

import os
import subprocess

import ray
from openrlhf.utils.logging_utils import init_logger

from cooper_openrlhf.algo.hacking import HackingAlarm
from cooper_openrlhf.ray.checkpoint_tags import RM_DIR, mark_pair_whole, resume_point, unmark_pair
from cooper_openrlhf.ray.save_request import answer_request, pending_request
from cooper_openrlhf.ray.trainer_state import CooperTrainerState

logger = init_logger(__name__)

SAVE_MOMENT_HOOK = "COOPER_SAVE_MOMENT_HOOK"
# In the policy checkpoint's client states: --cooper.on_hacking rule_reward was taken, so a resumed run keeps paying
# by the rule verifier, as the run it continues did (a requeue must not hand the policy back to a hacked RM).
PAYING_RULE_STATE = "cooper_paying_rule"


def save_moment(moment: str, tag: str) -> None:
    """Run $COOPER_SAVE_MOMENT_HOOK with the moment and the tag, and wait for it (a test's preemption lands
    exactly here: the hook signals the job and never returns); nothing without it."""
    hook = os.environ.get(SAVE_MOMENT_HOOK)
    if hook:
        subprocess.run([hook, moment, tag], check=True)


class CheckpointUnit(CooperTrainerState):
    """The policy and the RM checkpointed as one unit (module docstring); extends PPOTrainer's checkpoint methods."""

    _latest_eval_metric_value: float | None  # PPOTrainer's: the metric its scheduled save passes to the rotation

    def init_checkpoint_states(self):
        """OpenRLHF's resume, plus the RM checkpoint of the pair the policy loaded (model, optimizer, scheduler,
        counters): after a best save that is `best_global_stepN`, and N need not be a --ckpt.save_steps step."""
        states = super().init_checkpoint_states()
        step = states["global_step"]
        if states.get(PAYING_RULE_STATE) and not self.hacking.paying_rule:
            self.hacking.paying_rule = True
            logger.warning("resumed at step %d paying the policy by the rule verifier: --cooper.on_hacking rule_reward "
                           "was taken before the checkpoint", step)
        if self.rm_trainable and step > 0:
            point = resume_point(self.args.ckpt.path)  # the driver pointed the policy's `latest` at it
            if point.rm_tag is None:
                raise FileNotFoundError(f"the policy resumed from {point.policy_tag} (step {step}) but "
                                        f"{os.path.join(self.args.ckpt.path, RM_DIR)} holds no RM checkpoint")
            rm_states = ray.get(self.rm_group.async_run_method(method_name="load_checkpoint", tag=point.rm_tag))[0]
            if rm_states.get("global_step") != step:
                raise RuntimeError(f"the RM checkpoint {point.rm_tag} records step {rm_states.get('global_step')}, "
                                   f"the policy's {point.policy_tag} step {step}")
            logger.info("resumed the Cooper RM from %s with the policy's %s (global step %d): %s", point.rm_tag,
                        point.policy_tag, step, rm_states.get("cooper_rm_counters"))
        return states

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        """OpenRLHF's logging and scheduled policy checkpoint, then the RM's under the same tag, then the marker;
        off the schedule, the step's checkpoint when one was requested or the hacking alarm stops the run."""
        scheduled = global_step % self.args.ckpt.save_steps == 0
        tag = f"global_step{global_step}"
        client_states = self.with_cooper_states(client_states)
        if scheduled:
            self.begin_pair(tag)
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        if scheduled:
            self.finish_pair(tag, client_states)
        saved = scheduled
        requested = pending_request(self.args.ckpt.path)
        if requested is not None:
            if not saved:
                self.save_checkpoint_now(global_step, client_states)
                saved = True
            answer_request(self.args.ckpt.path, tag)
            logger.info("checkpoint %s saved on request (%s)", tag, requested or "no reason given")
        if self.hacking.stop:
            if not saved:
                self.save_checkpoint_now(global_step, client_states)
            raise HackingAlarm(f"reward hacking suspected at step {global_step} (reasons in the log above); "
                               f"--cooper.on_hacking stop saved checkpoint global_step{global_step} under "
                               f"{self.args.ckpt.path} and ended the run")

    def with_cooper_states(self, client_states) -> dict:
        """OpenRLHF's client states of a policy checkpoint, plus Cooper's (PAYING_RULE_STATE)."""
        return {**(client_states or {}), PAYING_RULE_STATE: self.hacking.paying_rule}

    def save_checkpoint_now(self, global_step: int, client_states=None) -> None:
        """This step's policy and RM checkpoint, off --ckpt.save_steps' schedule: the states and rotation metric
        OpenRLHF's scheduled save passes (PPOTrainer.save_logs_and_checkpoints), called directly."""
        tag = f"global_step{global_step}"
        states = {**(client_states or {}), "best_eval_metric_key": self.best_eval_metric_key,
                  "best_eval_metric_value": self.best_eval_metric_value,
                  "latest_eval_metric_value": self._latest_eval_metric_value}
        self.begin_pair(tag)
        ray.get(self.actor_model_group.async_run_method(
            method_name="save_checkpoint", tag=tag, client_states=states, metric_value=self._latest_eval_metric_value,
            metric_key=states.get("checkpoint_metric_key") or self.best_eval_metric_key or None))
        self.finish_pair(tag, client_states)

    def save_best_checkpoint(self, eval_metrics, global_step, client_states=None):
        """OpenRLHF's best-policy checkpoint, with the RM of that step saved under the same tag (a best policy
        restored without its RM would be scored by another RM than the one it was trained against)."""
        best_before = self.best_eval_metric_value
        tag = f"best_global_step{global_step}"
        states = self.with_cooper_states(client_states)  # the base class adds the best-metric keys to it
        key = self._detect_eval_metric_key(eval_metrics) if eval_metrics else None
        if key in (eval_metrics or {}) and eval_metrics[key] > best_before:  # the base class's test for a best save
            self.begin_pair(tag)
        super().save_best_checkpoint(eval_metrics, global_step, states)
        if self.best_eval_metric_value != best_before:
            self.finish_pair(tag, states)

    def begin_pair(self, tag: str) -> None:
        """Before the policy's save under `tag`: the tag is no whole pair until the RM's save returns too."""
        if self.rm_trainable:
            unmark_pair(self.args.ckpt.path, tag)
        save_moment("before_policy_save", tag)

    def finish_pair(self, tag: str, client_states) -> None:
        """After the policy's save under `tag`: the RM's under the same tag, the RM checkpoints whose policy
        checkpoint the rotation removed go, and the pair is marked whole."""
        save_moment("before_rm_save", tag)
        if self.rm_trainable:
            ray.get(self.rm_group.async_run_method(method_name="save_checkpoint", tag=tag,
                                                   client_states=dict(client_states or {})))
            ray.get(self.rm_group.async_run_method(method_name="keep_policy_tags"))
        save_moment("before_marker", tag)
        if self.rm_trainable:
            mark_pair_whole(self.args.ckpt.path, tag)
        save_moment("after_marker", tag)
