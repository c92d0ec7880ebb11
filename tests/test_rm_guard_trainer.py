"""The RM guard in the trainer's step (`ray/rm_guard.py`), with fake actor handles (tests/cooper_trainer_fakes.py).

The fake RM pays an answer that boxes the reference logit 2 and any other -1, and each update adds 0.5 to every
logit: after three updates it pays wrong answers sigmoid(0.5) = 0.62, more than 0.3 above the starting RM's 0.27,
so that version is out of the guard's pay band (its AUC stays 1: a drift the hacking alarm's gap would also see
only later, as it reads the policy's rollouts)."""

import json
import math

import pytest
import torch

import cooper_trainer_fakes as fakes
from cooper_trainer_fakes import COOPER, QUESTIONS, REFERENCES, make_trainer, pool, samples

__all__ = ["make_trainer", "pool"]  # the fixtures, used by name

START_WRONG_PAY = 1 / (1 + math.exp(1))  # sigmoid(-1)


class GuardedRM(fakes.FakeRM):
    """The fake RM with the guard's actor methods; records the bias each scoring of rollouts (not of anchors) saw."""

    def __init__(self, ckpt_dir=None):
        super().__init__(ckpt_dir)
        self.lr_scale, self.scored_with, self.held, self.optimizer_steps = 1.0, [], None, 0

    def score(self, questions, references, completions):
        if not any(c.startswith("anchor") for c in completions):
            self.scored_with.append(self.bias)
        return super().score(questions, references, completions)

    def fit(self, pairs, global_valid):
        before = self.bias
        metrics = super().fit(pairs, global_valid)
        self.bias = before + 0.5 * self.lr_scale
        self.optimizer_steps += 1
        return {**metrics, "cooper/rm_optimizer_steps": float(self.optimizer_steps)}

    def snapshot(self):
        self.held = (self.bias, self.optimizer_steps)

    def restore_snapshot(self):
        (self.bias, self.optimizer_steps), self.held = self.held, None
        return float(self.optimizer_steps)

    def drop_snapshot(self):
        self.held = None

    def weights_finite(self):
        return True

    def scale_lr(self, factor):
        self.lr_scale *= factor
        return self.lr_scale


@pytest.fixture
def guarded(make_trainer, monkeypatch, tmp_path):
    from cooper_openrlhf.ray import rm_guard

    monkeypatch.setattr(rm_guard, "ray", fakes.FakeRay)
    monkeypatch.setattr(fakes, "FakeRM", GuardedRM)
    anchors = tmp_path / "anchors.jsonl"
    rows = [{"question": q, "reference": r, "completion": f"anchor: so \\boxed{{{int(r) + wrong}}}",
             "label": int(not wrong)} for q, r in zip(QUESTIONS, REFERENCES) for wrong in (0, 1)]
    anchors.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return lambda *flags: make_trainer((*COOPER, "--cooper.rm_anchors", str(anchors), *flags))


def _run(trainer, steps, first=0):
    statuses = []
    for step in range(first, first + steps):
        status, next_step = trainer.train_step(samples(), step)
        trainer.save_logs_and_checkpoints(next_step, status, {"global_step": next_step, "episode": 0,
                                                              "total_consumed_prompts": 3 * next_step,
                                                              "data_loader_state_dict": {}})
        statuses.append(status)
    return statuses


def _wrong_pay(bias):
    return float(torch.sigmoid(torch.tensor(-1.0 + bias)))


def test_without_the_guard_the_steps_are_scored_by_versions_out_of_bounds(guarded):
    trainer, _, rm = guarded("--cooper.rm_guard", "watch")
    statuses = _run(trainer, 5)
    assert rm.bias == 2.5 and statuses[-1]["cooper/rm_health/unhealthy_kept"] == 3
    assert max(_wrong_pay(b) for b in rm.scored_with) > START_WRONG_PAY + 0.3


def test_the_guard_rolls_back_before_the_next_step_is_scored_and_lowers_the_rm_lr(guarded):
    trainer, _, rm = guarded()
    statuses = _run(trainer, 6)
    third = statuses[2]
    assert third["cooper/rm_health/unhealthy"] == 1.0 and third["cooper/rm_health/rollbacks"] == 1.0
    assert third["cooper/rm_health/update_wrong_pay"] == pytest.approx(_wrong_pay(1.5))
    assert third["cooper/rm_health/wrong_pay"] == pytest.approx(_wrong_pay(1.0))  # the version scoring from now on
    assert rm.lr_scale < 1.0 and third["cooper/rm_health/lr_scale"] == 0.5
    # the step logs the optimizer's count after the rollback: the two kept updates, not the undone third
    assert third["cooper/rm_optimizer_steps"] == 2.0 and statuses[3]["cooper/rm_optimizer_steps"] == 3.0
    # every step's rollouts were scored by a version inside the band
    assert len(rm.scored_with) == 6 and all(_wrong_pay(b) <= START_WRONG_PAY + 0.3 for b in rm.scored_with)
    assert statuses[-1]["cooper/rm_health/auc"] == 1.0 and rm.held is None  # no snapshot held between updates


def test_skip_leaves_the_rm_alone_for_its_steps_and_stop_checkpoints_and_ends_the_run(guarded):
    from cooper_openrlhf.ray.rm_guard import RMGuardStop

    trainer, _, rm = guarded("--cooper.rm_guard_response", "skip", "--cooper.rm_guard_skip_steps", "2")
    _run(trainer, 3)
    fits = len(rm.fits)
    statuses = _run(trainer, 2, 3)
    assert len(rm.fits) == fits and [s["cooper/rm_health/skipping"] for s in statuses] == [1.0, 0.0]
    assert all(s["cooper/rm_updated"] == 0.0 for s in statuses)
    _run(trainer, 1, 5)
    assert len(rm.fits) == fits + 1

    stopping, _, _ = guarded("--cooper.rm_guard_response", "stop")
    _run(stopping, 2)
    with pytest.raises(RMGuardStop, match="saved checkpoint global_step3"):
        _run(stopping, 1, 2)
    assert stopping.policy.saved == "global_step3"


def test_a_run_resumed_mid_guard_keeps_its_guard_state(guarded, tmp_path):
    flags = ("--cooper.rm_guard_response", "skip", "--cooper.rm_guard_skip_steps", "3", "--ckpt.save_steps", "1",
             "--ckpt.path", str(tmp_path / "ckpt"), "--ckpt.load_enable")
    trainer, _, _ = guarded(*flags)
    _run(trainer, 4)  # rolled back at step 3 (index 2), one of its three skips taken at index 3
    assert trainer.rm_guard.skip_left == 2 and trainer.rm_guard.rollbacks == 1
    requeued, _, rm = guarded(*flags)
    assert requeued.rm_guard.rollbacks == 0
    assert requeued.init_checkpoint_states()["global_step"] == 4
    assert requeued.rm_guard.state_dict() == trainer.rm_guard.state_dict()
    _run(requeued, 2, 4)
    assert rm.fits == []  # the two skips the checkpoint still owed
