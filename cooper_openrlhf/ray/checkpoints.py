"""The policy and the Cooper RM checkpointed as one unit, a mixin of `ray/trainer.CooperPPOTrainer`.

OpenRLHF saves the policy under {ckpt.path}/_actor/<tag> and rotates those checkpoints by eval metric; the RM
saves under {ckpt.path}/_rm/<tag> with the same tag (`reward_actor.save_checkpoint`) and then keeps exactly the
tags the policy kept (`keep_policy_tags`), so a resume always finds the RM of the policy it loads, and a best
policy is kept with the RM it was trained against. A resume loads the RM at the tag the policy loaded
(`checkpoint_tags.resume_tags`), `best_global_stepN` after a best save. After a hacking alarm under --cooper.on_hacking stop the step
is checkpointed whatever --ckpt.save_steps says, and the run ends with `HackingAlarm`.
"""

import os

import ray
from openrlhf.utils.logging_utils import init_logger

from cooper_openrlhf.algo.hacking import HackingAlarm
from cooper_openrlhf.ray.checkpoint_tags import RM_DIR, resume_tags

logger = init_logger(__name__)


class CheckpointUnit:
    """Needs of the trainer: args, rm_trainable, rm_group, actor_model_group, stop_for_hacking, and PPOTrainer's
    checkpoint methods and best-metric fields."""

    def init_checkpoint_states(self):
        """OpenRLHF's resume, plus the RM checkpoint of the policy checkpoint it loaded (model, optimizer, scheduler,
        counters): after a best save that is `best_global_stepN`, and N need not be a --ckpt.save_steps step."""
        states = super().init_checkpoint_states()
        step = states["global_step"]
        if self.rm_trainable and step > 0:
            policy_tag, tag = resume_tags(self.args.ckpt.path)  # the tag the policy's DeepSpeed `latest` named
            if tag is None:
                raise FileNotFoundError(f"the policy resumed from {policy_tag} (step {step}) but "
                                        f"{os.path.join(self.args.ckpt.path, RM_DIR)} holds no RM checkpoint")
            rm_states = ray.get(self.rm_group.async_run_method(method_name="load_checkpoint", tag=tag))[0]
            if rm_states.get("global_step") != step:
                raise RuntimeError(f"the RM checkpoint {tag} records step {rm_states.get('global_step')}, the policy's "
                                   f"{policy_tag} step {step}")
            logger.info("resumed the Cooper RM from %s with the policy's %s (global step %d): %s", tag, policy_tag,
                        step, rm_states.get("cooper_rm_counters"))
        return states

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        """OpenRLHF's logging and scheduled policy checkpoint, with the RM's under the same tag beside it."""
        scheduled = global_step % self.args.ckpt.save_steps == 0
        rm_refs = self.rm_checkpoint_refs(f"global_step{global_step}", client_states) if scheduled else []
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        self.finish_rm_checkpoint(rm_refs)
        if self.stop_for_hacking:
            if not scheduled:
                self.save_checkpoint_now(global_step, client_states)
            raise HackingAlarm(f"reward hacking suspected at step {global_step} (reasons in the log above); "
                               f"--cooper.on_hacking stop saved checkpoint global_step{global_step} under "
                               f"{self.args.ckpt.path} and ended the run")

    def save_checkpoint_now(self, global_step: int, client_states=None) -> None:
        """This step's policy and RM checkpoint, off --ckpt.save_steps' schedule: the states and rotation metric
        OpenRLHF's scheduled save passes (PPOTrainer.save_logs_and_checkpoints), called directly."""
        tag = f"global_step{global_step}"
        states = {**(client_states or {}), "best_eval_metric_key": self.best_eval_metric_key,
                  "best_eval_metric_value": self.best_eval_metric_value,
                  "latest_eval_metric_value": self._latest_eval_metric_value}
        rm_refs = self.rm_checkpoint_refs(tag, client_states)
        ray.get(self.actor_model_group.async_run_method(
            method_name="save_checkpoint", tag=tag, client_states=states, metric_value=self._latest_eval_metric_value,
            metric_key=states.get("checkpoint_metric_key") or self.best_eval_metric_key or None))
        self.finish_rm_checkpoint(rm_refs)

    def save_best_checkpoint(self, eval_metrics, global_step, client_states=None):
        """OpenRLHF's best-policy checkpoint, with the RM of that step saved under the same tag (a best policy
        restored without its RM would be scored by another RM than the one it was trained against)."""
        best_before = self.best_eval_metric_value
        states = dict(client_states or {})  # the base class adds the best-metric keys to it
        super().save_best_checkpoint(eval_metrics, global_step, states)
        if self.best_eval_metric_value != best_before:
            self.finish_rm_checkpoint(self.rm_checkpoint_refs(f"best_global_step{global_step}", states))

    def rm_checkpoint_refs(self, tag: str, client_states) -> list:
        """Start the RM's checkpoint under `tag` (nothing for an RM that does not train)."""
        if not self.rm_trainable:
            return []
        return self.rm_group.async_run_method(method_name="save_checkpoint", tag=tag,
                                              client_states=dict(client_states or {}))

    def finish_rm_checkpoint(self, refs: list) -> None:
        """Wait for the RM's checkpoint, then keep the RM checkpoints whose policy checkpoint the rotation kept."""
        if refs:
            ray.get(refs)
            ray.get(self.rm_group.async_run_method(method_name="keep_policy_tags"))
