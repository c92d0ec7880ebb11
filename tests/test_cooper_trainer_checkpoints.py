"""The middle layer: the policy and the RM checkpointed as one unit by `CooperPPOTrainer`, and the stop on a hacking
alarm, with fake actor handles (tests/cooper_trainer_fakes.py)."""

import os

import pytest

from cooper_trainer_fakes import ALARM_AT_STEP_3, COOPER, RM, VERIFIED, make_trainer, pool, samples

__all__ = ["make_trainer", "pool"]  # the fixtures, used by name


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


def test_a_run_resumed_after_the_alarm_switched_to_the_rule_reward_keeps_paying_by_the_rule(make_trainer, tmp_path):
    """--cooper.on_hacking rule_reward: once the alarm took the policy off the RM, a requeued run goes on paying by
    the rule verifier (the switch is in the policy checkpoint's client states), not by the RM it stopped trusting."""
    flags = (*RM, *ALARM_AT_STEP_3, "--cooper.on_hacking", "rule_reward", "--ckpt.save_steps", "1",
             "--ckpt.path", str(tmp_path / "ckpt"), "--ckpt.load_enable")
    trainer, _, _ = make_trainer(flags)
    for step in range(4):
        status, next_step = trainer.train_step(samples(), step)
        trainer.save_logs_and_checkpoints(next_step, status, {"global_step": next_step, "episode": 0,
                                                              "total_consumed_prompts": 3 * next_step,
                                                              "data_loader_state_dict": {}})
    assert trainer.hacking.paying_rule and status["cooper/reward_from_rule"] == 1.0

    requeued, _, _ = make_trainer(flags)  # a new job on the same folder
    assert not requeued.hacking.paying_rule
    assert requeued.init_checkpoint_states()["global_step"] == 4 and requeued.hacking.paying_rule
    batch = samples()
    requeued.train_step(batch, 4)
    assert [float(s.rewards[0]) for s in batch] == [float(v) for v in VERIFIED]  # the rule's verdicts, not the RM's


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
    """Step 3 was evaluated (the best so far) but not a save step, so OpenRLHF saved the policy as
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


def test_a_requested_save_checkpoints_the_step_in_flight_as_one_unit_and_answers_with_its_tag(make_trainer, tmp_path):
    """A save request (the RL launcher writes one when Slurm warns of the time limit): the step ending next is saved,
    policy and RM, off --ckpt.save_steps' schedule; the answer names its tag; a request met by a scheduled save
    costs no second save; a requeued run resumes at the requested step, and a stale answer is cleared."""
    from cooper_openrlhf.cli.train_cooper import clear_save_requests
    from cooper_openrlhf.ray.checkpoint_tags import resume_point

    ckpt = tmp_path / "ckpt"
    flags = (*COOPER, "--ckpt.save_steps", "4", "--ckpt.path", str(ckpt), "--ckpt.load_enable")
    trainer, _, rm = make_trainer(flags)

    def end_of_step(step):
        trainer.save_logs_and_checkpoints(step, {}, {"global_step": step, "episode": 0,
                                                     "total_consumed_prompts": 3 * step, "data_loader_state_dict": {}})

    end_of_step(1)
    assert not hasattr(trainer.policy, "saved")
    ckpt.mkdir()
    (ckpt / "save_request").write_text("USR1: time limit ahead\n")
    end_of_step(2)
    assert trainer.policy.saved == "global_step2" and rm.saved == ["global_step2"]
    assert (ckpt / "save_request.done").read_text() == "global_step2\n" and not (ckpt / "save_request").exists()
    assert resume_point(str(ckpt)).policy_tag == "global_step2", "the pair is marked whole"
    end_of_step(3)
    assert rm.saved == ["global_step2"], "a request is met once"
    (ckpt / "save_request").write_text("")
    end_of_step(4)  # a scheduled save step
    assert rm.saved == ["global_step2", "global_step4"] and (ckpt / "save_request.done").read_text() == "global_step4\n"

    (ckpt / "save_request").write_text("left by an attempt that ended before the step did\n")
    clear_save_requests(str(ckpt))  # what a requeued run's driver does first
    assert not (ckpt / "save_request").exists() and not (ckpt / "save_request.done").exists()
    requeued, _, rm = make_trainer(flags)
    states = requeued.init_checkpoint_states()
    assert states["global_step"] == 4 and rm.loaded == "global_step4"


def test_stale_rm_checkpoints_are_the_tags_the_policy_no_longer_has(tmp_path):
    from cooper_openrlhf.ray.reward_actor import stale_rm_checkpoints

    for side, tags in (("_actor", ["global_step4", "best_global_step2"]),
                       ("_rm", ["global_step2", "global_step4", "best_global_step2", "best_global_step1"])):
        for tag in tags:
            (tmp_path / side / tag).mkdir(parents=True)
    (tmp_path / "_rm" / "latest").write_text("global_step4")  # DeepSpeed's pointer file is not a checkpoint
    assert stale_rm_checkpoints(str(tmp_path / "_rm"), str(tmp_path / "_actor")) == ["best_global_step1",
                                                                                       "global_step2"]


