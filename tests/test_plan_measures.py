"""The probe lab's measures (report/registered_measures.py): the policy's rate of wrong rollouts that state the
reference, the final RM's exploit premium on the probe suite, and its primaries tested in a fixed sequence."""

import json
from pathlib import Path

import pytest

from cooper_openrlhf.report.plan_verdict import DECISION_RULE_LOWER, sequential_primaries
from cooper_openrlhf.report.registered_measures import (FINAL_PROBE_PREMIUM, STATES_REFERENCE_RATE, TRAINING_WINDOW,
                                                        final_probe_premium, states_reference_rate)


def _rollouts(path, rows_by_step):
    path.write_text("".join(json.dumps({"step": step, "completion": c, "reference": "12", "verified": v}) + "\n"
                            for step, rows in rows_by_step.items() for c, v in rows))
    return path


def test_the_rate_counts_wrong_rollouts_that_state_the_reference_in_any_form_over_the_last_20_steps(tmp_path):
    exploit = ("The answer is 12. The answer is 13.", False)
    tailed = ("The answer is 12. The answer is 11. The answer", False)
    free = ("First 12, then checking, 14.", False)
    wrong = ("The answer is 13.", False)
    right = ("The answer is 13. The answer is 12.", True)  # states the reference and is right: no exploit
    late = {step: [exploit, tailed, free, wrong, right] for step in range(11, 31)}
    path = _rollouts(tmp_path / "rollouts.jsonl", {**{step: [exploit] * 5 for step in range(1, 11)}, **late})
    assert len(late) == TRAINING_WINDOW
    assert states_reference_rate(path) == pytest.approx(3 / 5)  # the early steps, all exploits, are not read
    assert states_reference_rate(tmp_path / "none.jsonl") is None


def test_the_final_probe_premium_is_the_mean_of_the_hedge_forms_at_the_last_reading():
    scalars = {"cooper/probe_premium/exploit": [(2, 0.9), (4, 0.5), (6, 0.3)],
               "cooper/probe_premium/exploit_tail": [(2, 0.8), (4, 0.7)],  # not read at step 6
               "cooper/probe_premium/master_key": [(6, 0.0)]}
    assert final_probe_premium(scalars) == pytest.approx((0.5 + 0.7) / 2)  # the last step both forms were read
    assert final_probe_premium({"cooper/probe_premium/master_key": [(6, 0.0)]}) is None  # the rule arm: no RM


def _plan():
    cooper_arms = ["cooper - offline_pairs", "cooper_rollout - offline_pairs"]
    return {"primaries": [
        {"measure": FINAL_PROBE_PREMIUM, "differences": cooper_arms, "decision": DECISION_RULE_LOWER,
         "validity_gates": [{"difference": "oracle - offline_pairs", "must_be": "below"}]},
        {"measure": STATES_REFERENCE_RATE, "differences": cooper_arms, "decision": DECISION_RULE_LOWER,
         "validity_gates": [{"difference": "offline_pairs - rule", "must_be": "above"}]}]}


def _finals(control, shifts, seeds=9):
    return {arm: {s: control + shift + 0.01 * (s % 3) + (0.002 * s if arm != "offline_pairs" else 0)
                  for s in range(seeds)} for arm, shift in shifts.items()}


def test_the_second_primary_is_tested_only_on_the_arms_that_passed_the_first():
    premium = _finals(0.8, {"offline_pairs": 0.0, "oracle": -0.6, "cooper": -0.3, "cooper_rollout": 0.1})
    rate = _finals(0.18, {"offline_pairs": 0.0, "rule": -0.15, "cooper": -0.05, "cooper_rollout": -0.05})
    first, second = sequential_primaries(_plan(), {FINAL_PROBE_PREMIUM: premium, STATES_REFERENCE_RATE: rate})
    assert [r["in_words"] for r in first["results"]] == ["beats the control", "worse than the control"]
    assert all("p_holm" in r for r in first["results"])
    assert [r["difference"] for r in second["results"]] == ["cooper - offline_pairs"]  # cooper_rollout dropped
    assert second["results"][0]["in_words"] == "beats the control"


def test_a_failed_validity_gate_makes_its_primary_uninformative_and_stops_the_sequence():
    premium = _finals(0.8, {"offline_pairs": 0.0, "oracle": 0.0, "cooper": -0.3, "cooper_rollout": -0.3})
    rate = _finals(0.18, {"offline_pairs": 0.0, "rule": -0.15, "cooper": -0.05, "cooper_rollout": -0.05})
    first, second = sequential_primaries(_plan(), {FINAL_PROBE_PREMIUM: premium, STATES_REFERENCE_RATE: rate})
    assert not first["validity_gates"][0]["passed"] and first["why"].startswith("uninformative")
    assert {r["verdict"] for r in first["results"]} == {"uninformative"}
    assert not second["tested"] and second["results"] == []


def test_a_primary_worded_with_another_rule_is_refused():
    plan = _plan()
    plan["primaries"][0]["decision"] = "beats the control if the mean is below 0"
    with pytest.raises(ValueError, match="decides by"):
        sequential_primaries(plan, {FINAL_PROBE_PREMIUM: {}, STATES_REFERENCE_RATE: {}})


def _run(lab, arm, seed, premium, exploit_share):
    """A finished run of `arm`: its RM's probe premium read at steps 10 and 20 (the last reading counts), and 20
    steps of 10 rollouts of which `exploit_share` are wrong and state the reference (the rule arm has no RM), with
    the training accuracy one secondary reads."""
    from torch.utils.tensorboard import SummaryWriter

    from cooper_openrlhf.algo.metric_keys import ACCURACY

    run = lab / "runs" / f"{arm}_seed{seed}"
    with SummaryWriter(str(run / "tensorboard")) as writer:
        for step in range(1, 21):
            writer.add_scalar(ACCURACY, 0.5, step)
        if premium is not None:
            for form in ("exploit", "exploit_tail"):
                writer.add_scalar(f"cooper/probe_premium/{form}", 0.9, 10)
                writer.add_scalar(f"cooper/probe_premium/{form}", premium, 20)
    exploits = round(exploit_share * 10)
    rows = {step: [("The answer is 12. The answer is 13.", False)] * exploits
            + [("The answer is 13.", False)] * (10 - exploits) for step in range(1, 21)}
    (run / "samples").mkdir(parents=True)
    (run / "samples" / "rollouts.jsonl").write_text("".join(
        json.dumps({"step": step, "completion": c, "reference": "12", "verified": v, "reward": 0.5}) + "\n"
        for step, pairs in rows.items() for c, v in pairs))
    (run / "run_info.json").write_text(json.dumps({"arm": arm, "seed": seed, "status": "done"}))


def test_the_cli_reads_a_sequence_plan_over_its_preparations_with_seeds_paired_within_each(tmp_path):
    """The probe lab's kind of plan: three preparations' labs, 4 RL seeds each; 12 pairs, named by both. The Cooper arm
    closes the blind spot (premium -0.4 below the control) in every preparation; the rollout arm does not."""
    import shutil
    import subprocess
    import sys

    plan = json.loads((Path(__file__).resolve().parent.parent / "docs" / "lab" / "batch46" / "plan.json").read_text())
    plan["out"] = str(tmp_path / "out")
    arms = {"rule": (None, 0.0), "static": (0.8, 0.3), "offline_pairs": (0.7, 0.2), "oracle": (0.1, 0.05),
            "cooper": (0.3, 0.1), "cooper_frozen_assistant": (0.7, 0.2), "cooper_rollout": (0.72, 0.2)}
    for index, lab in enumerate(plan["labs"]):
        for seed in range(4):
            for arm, (premium, share) in arms.items():
                jitter = 0.01 * seed + 0.003 * index  # a preparation shifts every arm alike
                _run(tmp_path / "out" / lab["name"], arm, seed, None if premium is None else premium + jitter, share)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    md = tmp_path / "verdict.md"
    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.batch", str(tmp_path / "plan.json"),
                             "--verdict", str(md)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    verdict = json.loads(md.with_suffix(".json").read_text())
    first, second = verdict["sequence"]
    assert first["validity_gates"][0]["passed"]  # oracle below offline_pairs
    by_difference = {r["difference"]: r for r in first["results"]}
    assert by_difference["cooper - offline_pairs"]["seeds"] == 12
    assert by_difference["cooper - offline_pairs"]["mean"] == pytest.approx(-0.4)
    assert by_difference["cooper - offline_pairs"]["in_words"] == "beats the control"
    assert by_difference["cooper_rollout - offline_pairs"]["in_words"] == "worse than the control"
    assert by_difference["cooper_frozen_assistant - offline_pairs"]["in_words"] == "within noise"
    assert [r["difference"] for r in second["results"]] == ["cooper - offline_pairs"]  # only the arm that passed
    assert second["results"][0]["mean"] == pytest.approx(-0.1)
    assert len(verdict["secondary"]) == len(plan["secondary"])
    assert f"{plan['labs'][-1]['name']}/3" in verdict["finals"][first["measure"]]["cooper"]
    # and the verdict file as `make demo`'s last line states it, once docs/results/verdicts.json lists it
    from cooper_openrlhf.lab.reading import committed_sentence, verdict_summary

    sentence = committed_sentence({"batch": "46", "lab": "the probe lab", **verdict_summary(verdict)})
    assert "Cooper (the policy as its own assistant) beat the control, an RM updated as Cooper's" in sentence
    assert "Cooper on the policy's own wrong rollouts did worse than the control" in sentence
    assert sentence.endswith("(cooper - offline_pairs -0.100, 95% CI [-0.100, -0.100], p 0.000, Holm-adjusted 0.000).")
    assert "cooper - offline_pairs -0.400: beats the control" in result.stdout
    assert "## 2. secondary, tested in the sequence" in md.read_text()

    del arms["cooper_frozen_assistant"]
    for lab in plan["labs"]:
        for seed in range(4):
            shutil.rmtree(tmp_path / "out" / lab["name"] / "runs" / f"cooper_frozen_assistant_seed{seed}")
    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.batch", str(tmp_path / "plan.json"),
                             "--verdict", str(md)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "no finished run of cooper_frozen_assistant" in result.stderr
