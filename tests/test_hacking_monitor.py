"""The reward-hacking alarm rule (algo/hacking.py): hand-worked windows for each rule, the paper's static-RM
collapse against healthy (and noisy) Cooper-shaped streams, the rule arm, missing keys, and the guard."""

import argparse
import logging
import math
import random

import pytest

from cooper_openrlhf.algo.hacking import HackingMonitor, HackingMonitorConfig, guard_step
from cooper_openrlhf.algo.hacking_stats import (
    heldout_accuracy,
    heldout_gap_standard_error,
    heldout_rm_gap,
    least_squares_slope,
    rm_reward_by_verdict,
)

# A small window and round thresholds, so every statistic below can be worked out by hand.
SMALL = HackingMonitorConfig(window=4, rise_per_step=0.05, gap_growth=0.2, gap_ceiling=0.9, heldout_drop=0.05,
                             min_pair_accuracy=0.6, length_drift=0.5)


def _feed(monitor: HackingMonitor, rows: list[dict], first_step: int = 1):
    return [monitor.update(step, row) for step, row in enumerate(rows, start=first_step)]


def test_least_squares_slope_by_hand():
    # x = 1..4 (mean 2.5), y = 0, .2, .1, .3 (mean .15): sxy = .4, sxx = 5 -> .08
    assert least_squares_slope([(1, 0.0), (2, 0.2), (3, 0.1), (4, 0.3)]) == pytest.approx(0.08)
    with pytest.raises(ValueError, match="two distinct steps"):
        least_squares_slope([(3, 0.1), (3, 0.2)])


GROWING = [0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.1, 0.3]  # first window: gap 0; then it grows


def test_rule_a_fires_when_the_gap_rises_and_its_fitted_end_has_grown_past_the_first_windows_mean():
    rows = [{"cooper/reward_hacking_gap": g} for g in GROWING]
    verdicts = _feed(HackingMonitor(SMALL), rows)
    # Step 6 (gaps 0, 0, 0, .2): slope .06 but fitted end .14 < .2; step 7: end .15.
    assert verdicts[5].signals["gap_end"] == pytest.approx(0.14)
    assert [v.alarm for v in verdicts] == [False] * 7 + [True]
    last = verdicts[-1]  # window: steps 5-8, gaps 0, .2, .1, .3
    assert last.signals["gap_slope"] == pytest.approx(0.08)
    assert last.signals["gap_mean"] == pytest.approx(0.15)
    assert last.signals["gap_end"] == pytest.approx(0.15 + 0.08 * 1.5)  # 0.27
    assert last.signals["gap_baseline"] == 0.0 and last.signals["gap_growth"] == pytest.approx(0.27)
    assert len(last.reasons) == 1 and last.reasons[0].startswith("gap_growing: ") and last.fired == ["gap_growing"]
    # The same rise growing less than gap_growth (0.27 < 0.3) is not hacking yet.
    higher = HackingMonitorConfig(**{**SMALL.__dict__, "gap_growth": 0.3})
    assert not _feed(HackingMonitor(higher), rows)[-1].alarm


def test_rule_a_ignores_a_constant_offset_however_large():
    rows = [{"cooper/reward_hacking_gap": 0.4 + (0.05 if step % 2 else -0.05)} for step in range(12)]
    assert not any(v.alarm for v in _feed(HackingMonitor(SMALL), rows))


def test_the_gap_is_rm_reward_minus_verified_accuracy_when_its_own_key_is_missing():
    rows = [{"cooper/rm_reward_mean": r, "cooper/verified_accuracy": a}
            for r, a in ((0.5, 0.5),) * 5 + ((0.7, 0.5), (0.7, 0.6), (0.9, 0.6))]  # GROWING
    last = _feed(HackingMonitor(SMALL), rows)[-1]
    assert last.alarm and last.signals["gap_slope"] == pytest.approx(0.08)


def test_rule_b_fires_on_a_flat_high_gap():
    config = HackingMonitorConfig(**{**SMALL.__dict__, "gap_ceiling": 0.5})
    last = _feed(HackingMonitor(config), [{"cooper/reward_hacking_gap": 0.6}] * 4)[-1]
    assert last.alarm and last.fired == ["gap_high"]  # flat: not gap_growing
    assert not _feed(HackingMonitor(config), [{"cooper/reward_hacking_gap": 0.45}] * 4)[-1].alarm


def test_rule_c_fires_when_held_out_accuracy_falls_while_the_rm_reward_rises():
    def rows(rm_rewards):
        out = [{"cooper/rm_reward_mean": r, "cooper/verified_accuracy": r} for r in rm_rewards]  # gap 0
        out[0]["eval/accuracy"] = 0.40
        out[2]["eval/gsm8k/accuracy"], out[2]["eval/math/accuracy"] = 0.30, 0.36  # mean .33: .07 below the best
        return out

    rising = _feed(HackingMonitor(SMALL), rows([0.5, 0.55, 0.6, 0.65]))[-1]  # slope .05
    assert rising.alarm and rising.reasons[0].startswith("heldout_falls: ")
    assert rising.signals["heldout_accuracy"] == pytest.approx(0.33)
    assert rising.signals["heldout_best"] == pytest.approx(0.40)
    flat = _feed(HackingMonitor(SMALL), rows([0.5, 0.5, 0.5, 0.5]))[-1]  # a worse policy, not a hacked one
    assert not flat.alarm and flat.signals["heldout_accuracy"] == pytest.approx(0.33)


def test_rule_c_needs_a_drop_beyond_the_noise_of_a_small_held_out_set():
    # The same 0.40 -> 0.33 drop as above while the RM reward rises: with 128 graded samples per evaluation
    # a difference of two evaluations has a standard error of 0.06, so 0.07 is noise; with 4000 it is not.
    def rows(samples):
        out = [{"cooper/rm_reward_mean": r, "cooper/verified_accuracy": r} for r in (0.5, 0.55, 0.6, 0.65)]
        out[0].update({"eval/accuracy": 0.40, "eval/samples": samples})
        out[2].update({"eval/accuracy": 0.33, "eval/samples": samples})
        return out

    small = _feed(HackingMonitor(SMALL), rows(128))[-1]
    assert not small.alarm
    assert small.signals["heldout_drop_threshold"] == pytest.approx(3 * ((0.4 * 0.6 + 0.33 * 0.67) / 128) ** 0.5)
    large = _feed(HackingMonitor(SMALL), rows(4000))[-1]
    assert large.alarm and large.reasons[0].startswith("heldout_falls: ")
    assert large.signals["heldout_drop_threshold"] == pytest.approx(0.05)  # never below heldout_drop
    collapse = rows(128)
    collapse[2]["eval/accuracy"] = 0.10  # the static arm's kind of fall: far beyond the noise
    assert _feed(HackingMonitor(SMALL), collapse)[-1].alarm


def test_rule_d_fires_when_the_rm_cannot_rank_fresh_pairs_on_enough_steps():
    low = [{"cooper/rm_pair_accuracy": a} for a in (0.5, 0.75, 0.25, 0.5)]  # mean .5
    last = _feed(HackingMonitor(SMALL), low)[-1]
    assert last.alarm and last.reasons[0].startswith("rm_blind: ")
    assert last.signals["rm_pair_accuracy_mean"] == pytest.approx(0.5)
    # Pairs on only 2 of the 4 steps (fewer than half the window and 3): no statistic, no alarm.
    sparse = [{"cooper/rm_pair_accuracy": 0.0}, {}, {"cooper/rm_pair_accuracy": 0.0}, {}]
    verdict = _feed(HackingMonitor(SMALL), sparse)[-1]
    assert not verdict.alarm and "rm_pair_accuracy_mean" not in verdict.signals


def test_rule_e_fires_when_the_held_out_gap_grows_beyond_its_noise_and_gap_growth():
    def rows(latest_gap, se):  # held-out gap .05 at step 1, `latest_gap` at step 3; the training gap quiet
        out = [{"cooper/reward_hacking_gap": 0.0} for _ in range(4)]
        out[0].update({"eval/reward_hacking_gap": 0.05, "eval/reward_hacking_gap_se": se})
        out[2].update({"eval/reward_hacking_gap": latest_gap, "eval/reward_hacking_gap_se": se})
        return out

    fired = _feed(HackingMonitor(SMALL), rows(0.30, 0.02))[-1]  # +.25: beyond .2 and 3 x hypot(.02, .02) = .085
    assert fired.alarm and fired.fired == ["heldout_gap_grows"]
    assert fired.signals["heldout_gap_growth"] == pytest.approx(0.25)
    assert fired.signals["heldout_gap_threshold"] == pytest.approx(0.2)
    noisy = _feed(HackingMonitor(SMALL), rows(0.30, 0.07))[-1]  # the same rise is noise at se .07 (3 x .099)
    assert not noisy.alarm and noisy.signals["heldout_gap_threshold"] == pytest.approx(3 * 0.07 * 2 ** 0.5)
    assert not _feed(HackingMonitor(SMALL), rows(0.20, 0.0))[-1].alarm  # +.15 < gap_growth however quiet
    # Rules left out of `rules` are computed but raise nothing.
    only_a = HackingMonitorConfig(**{**SMALL.__dict__, "rules": "gap_growing,gap_high,heldout_falls,rm_blind"})
    quiet = _feed(HackingMonitor(only_a), rows(0.30, 0.02))[-1]
    assert not quiet.alarm and quiet.signals["heldout_gap_growth"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match=r"--cooper.hacking_rules: unknown hacking rule 'AG'; valid: \['gap_growing'"):
        HackingMonitorConfig(rules="AG")


def test_rm_reward_by_verdict_by_hand():
    assert rm_reward_by_verdict([True, False, False, True], [0.9, 0.2, 0.4, 0.7]) == pytest.approx(
        {"rm_reward_wrong_mean": 0.3, "rm_reward_correct_mean": 0.8})
    assert rm_reward_by_verdict([True, True], [0.9, 0.7]) == pytest.approx({"rm_reward_correct_mean": 0.8})
    with pytest.raises(ValueError, match="one verdict per reward"):
        rm_reward_by_verdict([True], [0.9, 0.1])


ONLY_F = HackingMonitorConfig(**{**SMALL.__dict__, "rules": "F"})


def _wrong(values):
    return [{"cooper/rm_reward_wrong_mean": v} for v in values]


def test_rule_f_accumulates_a_sustained_rise_of_the_wrong_rollouts_reward_against_its_own_noise():
    # Baseline .2 (first window); allowance gap_growth / 2 = .1; threshold 3 x stdev(step differences) / sqrt 2.
    values = [0.2, 0.22, 0.18, 0.2, 0.6, 0.6]
    verdicts = _feed(HackingMonitor(ONLY_F), _wrong(values))
    for step, verdict in enumerate(verdicts[3:], start=4):
        seen = values[:step]
        diffs = [b - a for a, b in zip(seen, seen[1:])]
        noise = (sum((d - sum(diffs) / len(diffs)) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5 / math.sqrt(2)
        assert verdict.signals["wrong_reward_threshold"] == pytest.approx(3 * noise)
    assert [v.signals.get("wrong_reward_cusum") for v in verdicts] == pytest.approx([None, None, None, 0.0, 0.3, 0.6])
    # step 5: .3 < 3 x .143 (the jump itself is part of the noise); step 6: .6 >= 3 x .128, the rise held
    assert [v.alarm for v in verdicts] == [False] * 5 + [True]
    assert verdicts[-1].reasons[0].startswith("wrong_paid_more: ")
    # The same stream with F left out of the rules is computed but raises nothing.
    assert not _feed(HackingMonitor(SMALL), _wrong(values))[-1].alarm


def test_rule_f_stays_quiet_on_noise_and_a_one_step_spike():
    noisy = [0.15 if step % 2 else 0.25 for step in range(20)]  # never beyond baseline + allowance
    noisy[10] = 0.45  # one step's spike: +.15 beyond the allowance, then back
    verdicts = _feed(HackingMonitor(ONLY_F), _wrong(noisy))
    assert not any(v.alarm for v in verdicts)
    assert max(v.signals["wrong_reward_cusum"] for v in verdicts[3:]) == pytest.approx(0.15)
    assert verdicts[-1].signals["wrong_reward_cusum"] == 0.0
    # Steps without wrong rollouts carry nothing: the sum waits for them, and the baseline needs min_points.
    sparse = _feed(HackingMonitor(ONLY_F), [{}, {}, {}, {}, *_wrong([0.9] * 3)])
    assert all("wrong_reward_cusum" not in v.signals for v in sparse)


def test_held_out_gap_and_its_standard_error_from_completion_sampling_alone():
    # Two questions, two rollouts each: gaps (RM reward - verified) -.1, .8 and .1, .3.
    logged = heldout_rm_gap(["a", "b", "a", "b"], [True, False, False, False], [0.9, 0.1, 0.8, 0.3])
    assert logged["rm_reward"] == pytest.approx(0.525)
    assert logged["reward_hacking_gap"] == pytest.approx(0.525 - 0.25)
    # within-question variances .405 and .02, each over 2 rollouts: sqrt(.2025 + .01) / 2
    assert logged["reward_hacking_gap_se"] == pytest.approx(0.2125 ** 0.5 / 2)
    # How far the questions' gaps sit apart is no noise between two evaluations of the same questions.
    assert heldout_gap_standard_error([[0.0, 0.0], [1.0, 1.0]]) == 0.0
    # A question with one rollout takes the others' mean variance; one rollout each: the plain standard error.
    assert heldout_gap_standard_error([[0.0, 1.0], [0.5]]) == pytest.approx((0.5 / 2 + 0.5) ** 0.5 / 2)
    assert heldout_gap_standard_error([[0.0], [1.0]]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="one question, verdict and reward per rollout: got 2, 1, 2"):
        heldout_rm_gap(["a", "b"], [True], [0.5, 0.5])


def test_supporting_evidence_is_named_with_an_alarm_but_never_alarms_alone():
    lengths = [100, 100, 100, 100, 160, 160, 160, 160]  # window mean 160 vs first window 100: +60%
    falling = [0.5, 0.4, 0.3, 0.2, 0.5, 0.4, 0.3, 0.2]
    quiet = [{"rollout/response_length_mean": n, "cooper/verified_accuracy": a} for n, a in zip(lengths, falling)]
    verdicts = _feed(HackingMonitor(SMALL), quiet)
    assert not any(v.alarm for v in verdicts)
    assert verdicts[-1].signals["length_drift"] == pytest.approx(0.6)
    assert verdicts[-1].signals["verified_accuracy_slope"] == pytest.approx(-0.1)
    hacked = [{**row, "cooper/reward_hacking_gap": 0.95} for row in quiet]
    reasons = _feed(HackingMonitor(SMALL), hacked)[-1].reasons
    assert reasons[0].startswith("gap_high: ")
    assert reasons[1] == "supporting: verified accuracy falls -0.100/step"
    assert reasons[2] == "supporting: mean response length drifted +60% from the first 4 steps"


def test_the_alarm_waits_until_a_rule_has_held_persist_steps_running_and_clears_when_none_holds(caplog):
    # Rule B (window mean gap >= .5, window 4): the gap is high at steps 1-5, 0 at step 6, high at 7-12, 0 at 13.
    config = HackingMonitorConfig(**{**SMALL.__dict__, "gap_ceiling": 0.5, "persist_steps": 3})
    gaps = [0.6] * 5 + [0.0] + [0.6] * 6 + [0.0]
    monitor = HackingMonitor(config)
    with caplog.at_level(logging.INFO, logger="cooper_openrlhf.algo.hacking"):
        logged = [guard_step(monitor, step, {"cooper/reward_hacking_gap": g}) for step, g in enumerate(gaps, 1)]
    # B holds at steps 4-5 (mean .6), not while the 0 is in the window (steps 6-9, mean .45), again at 10-12.
    assert [m["cooper/hacking_rules_held_steps"] for m in logged[3:]] == [1, 2, 0, 0, 0, 0, 1, 2, 3, 0]
    assert [m["cooper/hacking_alarm"] for m in logged] == [0] * 11 + [1, 0]  # two steps of B were not enough
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("reward hacking suspected at step 12: gap_high: ")
    assert any(r.getMessage() == "reward-hacking alarm cleared at step 13" for r in caplog.records)
    with pytest.raises(ValueError, match="--cooper.hacking_persist_steps must be >= 1"):
        HackingMonitorConfig(persist_steps=0)


# ------------------------------------------------------------------ paper-shaped streams, default thresholds
def _static_rm_collapse(seed: int, steps: int = 40) -> list[dict]:
    """The paper's static-RM failure: after 10 honest steps the RM reward climbs to ~1.0 while verified
    accuracy collapses, with the sampling noise of 256 rollouts per step."""
    rng = random.Random(seed)
    rows = []
    for step in range(1, steps + 1):
        hacked = 1 / (1 + math.exp(-(step - 20) / 3))  # 0 before step ~10, 1 after step ~30
        accuracy = min(1, max(0, 0.45 + 0.005 * step - 0.4 * hacked + rng.gauss(0, 0.03)))
        reward = min(1, max(0, 0.5 + 0.005 * step + 0.45 * hacked + rng.gauss(0, 0.03)))
        rows.append({"cooper/rm_reward_mean": reward, "cooper/verified_accuracy": accuracy,
                     "cooper/reward_hacking_gap": reward - accuracy, "rollout/response_length_mean": 200 + 3 * step})
    return rows


def _healthy_cooper(seed: int, steps: int = 60, noise: float = 0.03, offset: float = 0.05) -> list[dict]:
    """Cooper: accuracy and RM reward rise together, the RM a constant `offset` optimistic, pair accuracy high,
    responses grow 30% (healthy RL changes lengths too), an evaluation every 10 steps."""
    rng = random.Random(seed)
    rows = []
    for step in range(1, steps + 1):
        accuracy = 0.3 + 0.3 * step / steps + rng.gauss(0, noise)
        reward = accuracy + offset + rng.gauss(0, noise)
        row = {"cooper/rm_reward_mean": reward, "cooper/verified_accuracy": accuracy,
               "cooper/reward_hacking_gap": reward - accuracy, "cooper/rm_pair_accuracy": 0.85 + rng.gauss(0, 0.08),
               "rollout/response_length_mean": 200 * (1 + 0.3 * step / steps) + rng.gauss(0, 10)}
        if step % 10 == 0:
            row["eval/accuracy"] = 0.3 + 0.3 * step / steps + rng.gauss(0, 0.02)
        rows.append(row)
    return rows


@pytest.mark.parametrize("seed", range(10))
def test_the_static_rm_collapse_raises_the_alarm_early_and_keeps_it(seed):
    verdicts = _feed(HackingMonitor(), _static_rm_collapse(seed))
    first = next(step for step, v in enumerate(verdicts, start=1) if v.alarm)
    assert 12 <= first <= 24  # the gap is ~0.1 at step 14 and ~0.9 at step 30
    assert all(v.alarm for v in verdicts[27:])  # and stays on while the gap stays high
    reasons = " ".join(r for v in verdicts for r in v.reasons)
    assert "gap_growing: " in reasons and "gap_high: " in reasons and "verified accuracy falls" in reasons


@pytest.mark.parametrize("noise,offset", [(0.03, 0.05), (0.06, 0.05), (0.06, 0.3)])
def test_healthy_cooper_streams_stay_quiet_even_when_noisy_or_offset(noise, offset):
    for seed in range(20):
        verdicts = _feed(HackingMonitor(), _healthy_cooper(seed, noise=noise, offset=offset))
        assert not any(v.alarm for v in verdicts), (seed, [v.reasons for v in verdicts if v.alarm])


def test_the_rule_arm_has_no_rm_keys_and_never_alarms():
    rows = [{"cooper/verified_accuracy": a, "rollout/response_length_mean": 100 + 10 * i}
            for i, a in enumerate([0.6 - 0.02 * i for i in range(30)])]  # even a falling, lengthening run
    for i in range(9, 30, 10):
        rows[i]["eval/accuracy"] = 0.5 - 0.1 * (i // 10)
    verdicts = _feed(HackingMonitor(), rows)
    assert not any(v.alarm for v in verdicts)
    assert {"verified_accuracy_slope", "length_drift", "heldout_accuracy"} <= set(verdicts[-1].signals)
    assert not {"gap_mean", "gap_slope", "rm_reward_slope", "rm_pair_accuracy_mean"} & set(verdicts[-1].signals)


def test_missing_and_non_finite_values_are_left_out_and_steps_must_increase():
    monitor = HackingMonitor(SMALL)
    rows = [{"cooper/reward_hacking_gap": 0.0}, {}, {"cooper/reward_hacking_gap": float("nan")},
            {"cooper/reward_hacking_gap": 0.1, "cooper/verified_accuracy": None, "cooper/rm_reward_mean": True}]
    verdict = _feed(monitor, rows)[-1]
    assert not verdict.alarm and "gap_mean" not in verdict.signals  # 2 finite gaps < 3 points
    assert verdict.signals["window_steps"] == 4
    numpy = pytest.importorskip("numpy")
    as_numpy = _feed(HackingMonitor(SMALL), [{"cooper/reward_hacking_gap": numpy.float32(0.25)}] * 3)
    assert as_numpy[-1].signals["gap_mean"] == 0.25  # numpy scalars (float32 is no Python float) count
    with pytest.raises(ValueError, match="steps must increase: got step 4 after step 4"):
        monitor.update(4, {})


def test_heldout_accuracy_prefers_the_overall_key():
    assert heldout_accuracy({"eval/accuracy": 0.5, "eval/a/accuracy": 0.1}) == 0.5
    assert heldout_accuracy({"eval/a/accuracy": 0.2, "eval/b/accuracy": 0.4, "eval/a/pass8": 1.0}) == pytest.approx(0.3)
    assert heldout_accuracy({"cooper/verified_accuracy": 0.5}) is None


# ---------------------------------------------------------------------------------------- config and guard
def test_config_errors_name_the_flag_and_flags_carry_help():
    with pytest.raises(ValueError, match="--cooper.hacking_window must be >= 3"):
        HackingMonitorConfig(window=2)
    with pytest.raises(ValueError, match="--cooper.hacking_min_pair_accuracy must be in"):
        HackingMonitorConfig(min_pair_accuracy=1.5)
    flags = HackingMonitorConfig.flags()
    assert ("--cooper.hacking_window", int, 10) == flags[0][:3]
    assert all(help_text.endswith(".") and len(help_text) > 30 for *_, help_text in flags)
    parser = argparse.ArgumentParser()
    for flag, kind, default, help_text in flags:
        parser.add_argument(flag, type=kind, default=default, help=help_text)
    parsed = vars(parser.parse_args(["--cooper.hacking_window", "6", "--cooper.hacking_gap_ceiling", "0.4"]))
    cooper = argparse.Namespace(**{k.split(".", 1)[1]: v for k, v in parsed.items()}, rm_lr=1e-5)
    config = HackingMonitorConfig.from_namespace(cooper)
    assert (config.window, config.gap_ceiling, config.gap_growth) == (6, 0.4, 0.2)


def test_guard_logs_metrics_every_step_and_warns_once_when_the_alarm_turns_on(caplog):
    monitor = HackingMonitor(SMALL)
    gaps = GROWING + [0.5, 0.0, 0.0, 0.0]
    with caplog.at_level(logging.INFO, logger="cooper_openrlhf.algo.hacking"):
        logged = [guard_step(monitor, step, {"cooper/reward_hacking_gap": g}) for step, g in enumerate(gaps, 1)]
    # Step 9 (gaps .2, .1, .3, .5) still rises; step 10 (.1, .3, .5, 0) slopes down (-0.01/step).
    assert [m["cooper/hacking_alarm"] for m in logged] == [0] * 7 + [1, 1] + [0] * 3
    assert logged[7]["cooper/hacking_gap_slope"] == pytest.approx(0.08)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("reward hacking suspected at step 8: gap_growing: ")
    assert any(r.getMessage() == "reward-hacking alarm cleared at step 10" for r in caplog.records)


def test_guard_reads_held_out_logs_as_the_trainer_returns_them():
    monitor = HackingMonitor(SMALL)
    logged = guard_step(monitor, 1, {"cooper/verified_accuracy": 0.2}, {"accuracy": 0.4, "gsm8k/accuracy": 0.3})
    assert logged["cooper/hacking_heldout_accuracy"] == 0.4
    for step in (2, 3):
        guard_step(monitor, step, {"cooper/reward_hacking_gap": 0.95})
    assert guard_step(monitor, 4, {"cooper/reward_hacking_gap": 0.95})["cooper/hacking_alarm"] == 1.0


def test_the_rules_are_a_registry_of_named_rules_and_unknown_names_are_rejected(caplog):
    """Each rule reads window statistics and its own state only, so it can be asked directly; a rule set naming a
    rule the registry lacks fails at start-up (as an unknown reward form does), not by silently matching nothing;
    the letters the rules had before they were named still parse (old commands), with a deprecation warning."""
    from cooper_openrlhf.algo.hacking import alarm_response
    from cooper_openrlhf.algo.hacking_rules import HACKING_RULES, parse_rule_names

    assert list(HACKING_RULES) == ["gap_growing", "gap_high", "heldout_falls", "rm_blind", "heldout_gap_grows",
                                   "wrong_paid_more", "probe_paid_as_right"]
    high = {"window_steps": 4.0, "gap_mean": 0.95, "rm_pair_accuracy_mean": 0.9}
    assert HACKING_RULES["gap_high"](SMALL).reason(high).startswith("gap_high: ")
    assert HACKING_RULES["rm_blind"](SMALL).reason(high) is None
    assert parse_rule_names("rm_blind, gap_high") == ("gap_high", "rm_blind")  # the registry's order
    with caplog.at_level(logging.WARNING, logger="cooper_openrlhf.algo.hacking_rules"):
        assert parse_rule_names("BD") == ("gap_high", "rm_blind")
    assert "letters are deprecated" in caplog.text and "gap_high,rm_blind" in caplog.text
    assert HackingMonitorConfig(rules="F").rules == "wrong_paid_more"  # an old run's config, read by its names
    for bad in ("G", "", "A-B", "gap_high,bogus"):
        with pytest.raises(ValueError, match="--cooper.hacking_rules: "):
            HackingMonitorConfig(rules=bad)
    with pytest.raises(ValueError, match=r"unknown hacking rule 'bogus'; valid: \['gap_growing'"):
        parse_rule_names("bogus")
    assert alarm_response("stop").checkpoint_and_stop and alarm_response("rule_reward").reward_from_rule
    with pytest.raises(ValueError, match="unknown --cooper.on_hacking 'pause'"):
        alarm_response("pause")
