"""RM health and the guard (core/rm_health.py) and the anchors (rm/anchors.py): pure, hand-worked values."""

import json
import math

import pytest

from cooper_openrlhf.core.rm_health import GuardConfig, RMGuard, RMHealth, auc, health_metrics, health_of
from cooper_openrlhf.rm.anchors import (LABELLED, anchor_batch, default_anchor_file, load_anchor_rows,
                                        split_anchor_rows)
from cooper_openrlhf.rm.probes import Probe


def _anchor(form: str, correct: bool, question: str = "q") -> Probe:
    return Probe(form, question, "7", "text", correct)


def test_health_of_a_tiny_anchor_set_is_the_hand_computation():
    anchors = [_anchor(LABELLED, True), _anchor("right", True), _anchor(LABELLED, False), _anchor("wrong", False),
               _anchor("wrong", False), _anchor("exploit", False), _anchor("exploit", False),
               _anchor("master_key", False)]
    pays = [0.9, 0.6, 0.6, 0.2, 0.7, 0.8, 0.4, 0.1]
    health = health_of(anchors, pays)
    # right {0.9, 0.6} against wrong {0.6, 0.2, 0.7}: 0.9 beats all 3; 0.6 ties 0.6 (half), beats 0.2, loses to 0.7
    assert health.auc == pytest.approx((3 + 0.5 + 1) / 6)
    assert health.right_pay == pytest.approx(0.75)
    assert health.wrong_pay == pytest.approx(1.5 / 3)
    assert health.attack_pay == pytest.approx({"exploit": 0.6, "master_key": 0.1})
    assert health.anchors == 8 and health.finite
    metrics = health_metrics(health)
    assert metrics["cooper/rm_health/margin"] == pytest.approx(0.25)
    assert metrics["cooper/rm_health/attack_pay/exploit"] == pytest.approx(0.6)


def test_auc_edges():
    assert auc([1.0], [0.0]) == 1.0 and auc([0.0], [1.0]) == 0.0 and auc([0.5, 0.5], [0.5]) == 0.5
    assert math.isnan(auc([0.3], []))


def test_non_finite_pay_makes_the_health_non_finite():
    health = health_of([_anchor("right", True), _anchor("wrong", False)], [float("nan"), 0.1])
    assert not health.finite and math.isnan(health.auc)


def _health(auc_: float, right: float, wrong: float) -> RMHealth:
    return RMHealth(auc_, right, wrong, {}, 10)


def test_the_guard_rolls_back_a_version_out_of_bounds_and_takes_its_response():
    guard = RMGuard(GuardConfig(auc_drop=0.1, pay_drift=0.3, lr_factor=0.5))
    guard.start(_health(0.9, 0.9, 0.1))
    assert guard.judge(_health(0.95, 0.92, 0.08), "v1").healthy and guard.best_auc == 0.95
    low_auc = guard.judge(_health(0.84, 0.9, 0.1), "v2")  # 0.84 < 0.95 - 0.1
    assert low_auc.rollback and low_auc.lr_factor == 0.5 and "AUC 0.840 < best 0.950 - 0.1" in low_auc.message
    assert "v2" in low_auc.message and "rolled back" in low_auc.message
    assert guard.current.auc == 0.95  # the version scoring is still the last healthy one
    assert guard.judge(_health(0.9, 0.55, 0.1), "v3").reasons == ["right pay 0.550 < start 0.900 - 0.3"]
    assert guard.judge(_health(0.9, 0.9, 0.45), "v4").reasons == ["wrong pay 0.450 > start 0.100 + 0.3"]
    assert guard.judge(_health(0.9, 0.9, 0.1), "v5", weights_finite=False).reasons == ["its weights are not finite"]
    assert guard.rollbacks == 4 and guard.lr_scale == pytest.approx(0.5 ** 4)
    metrics = guard.metrics()
    assert metrics["cooper/rm_health/rollbacks"] == 4 and metrics["cooper/rm_health/auc"] == 0.95


def test_skip_and_stop_responses_and_watch_mode():
    skip = RMGuard(GuardConfig(response="skip", skip_steps=2))
    skip.start(_health(0.9, 0.9, 0.1))
    assert skip.judge(_health(0.5, 0.9, 0.1), "v1").rollback
    assert [skip.skip_update() for _ in range(3)] == [True, True, False]
    stop = RMGuard(GuardConfig(response="stop"))
    stop.start(_health(0.9, 0.9, 0.1))
    assert stop.judge(_health(0.5, 0.9, 0.1), "v1").stop and stop.stopped
    watch = RMGuard(GuardConfig(mode="watch"))
    watch.start(_health(0.9, 0.9, 0.1))
    kept = watch.judge(_health(0.5, 0.9, 0.1), "v1")
    assert not kept.healthy and not kept.rollback and watch.unhealthy_kept == 1 and watch.current.auc == 0.5
    broken = watch.judge(_health(0.9, 0.9, 0.1), "v2", weights_finite=False)  # no mode keeps non-finite weights
    assert broken.rollback and broken.lr_factor == 1.0 and watch.lr_scale == 1.0


def test_the_guard_state_round_trips_mid_skip():
    guard = RMGuard(GuardConfig(response="skip", skip_steps=3))
    guard.start(_health(0.9, 0.9, 0.1))
    guard.judge(_health(0.95, 0.9, 0.1), "v1")
    guard.judge(_health(0.5, 0.9, 0.1), "v2")
    guard.skip_update()
    resumed = RMGuard(GuardConfig(response="skip", skip_steps=3))
    resumed.load_state_dict(json.loads(json.dumps(guard.state_dict())))
    assert resumed.state_dict() == guard.state_dict()
    assert [resumed.skip_update() for _ in range(3)] == [True, True, False]
    resumed.start(_health(0.1, 0.1, 0.9))  # a resumed guard keeps its baseline
    assert resumed.baseline.right_pay == 0.9 and resumed.best_auc == 0.95


def test_guard_flags_and_bad_values():
    names = [flag for flag, *_ in GuardConfig.flags()]
    assert names[:2] == ["--cooper.rm_guard", "--cooper.rm_guard_response"]
    assert "--rm-guard-auc-drop" in [flag for flag, *_ in GuardConfig.flags("--rm-guard")]
    with pytest.raises(ValueError, match="lr_factor"):
        GuardConfig(lr_factor=1.5)
    with pytest.raises(ValueError, match="--cooper.rm_guard_response"):
        GuardConfig(response="pray")


def test_anchor_rows_load_both_formats_and_split_by_question(tmp_path):
    path = tmp_path / "anchors.jsonl"
    rows = [{"question": f"q{i // 2}", "reference": "1", "completion": f"c{i}", "label": i % 2} for i in range(12)]
    rows.append({"question": "qv", "answer": "2", "completion": "The answer is 2.", "gold_correct": True})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_anchor_rows(path)
    assert len(loaded) == 13 and loaded[-1].correct and loaded[-1].reference == "2" and loaded[0].form == LABELLED
    health, rest = split_anchor_rows(loaded, 4, seed=0)
    assert sum(r.correct for r in health) == 2 and sum(not r.correct for r in health) == 2
    assert not {r.question for r in health} & {r.question for r in rest}
    assert len(health) + len(rest) == 13
    assert split_anchor_rows(loaded, 4, seed=0) == (health, rest)  # seeded, not random
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "reference": "1", "completion": "c", "label": 3}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_anchor_rows(bad)
    assert anchor_batch(loaded, 5, step=3) == anchor_batch(loaded, 5, step=3) != anchor_batch(loaded, 5, step=4)


def test_the_default_anchor_file_is_the_recipes_held_out_split(tmp_path):
    (tmp_path / "verifyrm" / "pairs" / "seed0").mkdir(parents=True)
    (tmp_path / "verifyrm" / "best").mkdir()
    assert default_anchor_file(tmp_path / "verifyrm" / "best") is None
    (tmp_path / "verifyrm" / "eval_split.jsonl").write_text("")
    assert default_anchor_file(tmp_path / "verifyrm" / "best") == tmp_path / "verifyrm" / "eval_split.jsonl"
    assert default_anchor_file(tmp_path / "verifyrm" / "pairs" / "seed0") == tmp_path / "verifyrm" / "eval_split.jsonl"


def test_the_guard_arms_only_once_a_version_ranks_its_anchors():
    guard = RMGuard(GuardConfig(min_auc=0.7))
    assert "not armed" in guard.start(_health(0.55, 0.5, 0.5))  # a random head: nothing to protect yet
    kept = guard.judge(_health(0.6, 0.1, 0.9), "v1")
    assert kept.healthy and not kept.rollback and guard.rollbacks == 0
    armed = guard.judge(_health(0.8, 0.7, 0.3), "v2")
    assert guard.armed and "armed at v2" in armed.message and guard.baseline.right_pay == 0.7
    assert guard.judge(_health(0.8, 0.7, 0.65), "v3").rollback  # 0.65 > 0.3 + 0.3: the armed version's band
    resumed = RMGuard(GuardConfig(min_auc=0.7))
    resumed.load_state_dict(guard.state_dict())
    assert resumed.armed and resumed.baseline.wrong_pay == 0.3
