"""The lab's starting and last lines: what the warm-started policy and starting RM were, what the runs' curves
show and never claim, and the committed verdicts (docs/results/verdicts.json) stated whatever one seed shows."""

import json
import logging
from pathlib import Path

import pytest

from cooper_openrlhf.cli import lab as lab_cli

CHECKOUT = Path(__file__).resolve().parents[1]  # the repository these tests run in: its docs/ hold the verdicts


def _rows(steps, right_pay, wrong_pay, wrong_share=0.5, per_step=8):
    """A run's rollout rows: per step, `per_step` rollouts, a `wrong_share` of them verified wrong; the pays are
    functions of the step (a small spread so that an AUC is not all ties)."""
    rows = []
    for step in steps:
        for i in range(per_step):
            wrong = i < per_step * wrong_share
            pay = (wrong_pay if wrong else right_pay)(step) + 0.001 * i
            rows.append({"step": step, "verified": not wrong, "reward": pay, "completion": "x", "reference": "1"})
    return rows


def test_the_labs_last_lines_judge_each_rm_by_what_it_paid_right_and_wrong_training_rollouts():
    """make demo's closing lines: an RM whose policy's wrong answers come to be paid like right ones is exploited
    (whatever held-out accuracy does), one that pays them less while still paying right ones tells them apart, one
    that stops paying right answers is degenerate; held-out accuracy that starts near 0 is described, not the
    judge."""
    from cooper_openrlhf.lab.reading import PayEnds, full_lab_figure, pay_ends, reading

    steps = range(1, 81)
    static = pay_ends([_rows(steps, lambda s: 0.95, lambda s: 0.45 + 0.55 * s / 80)])
    cooper = pay_ends([_rows(steps, lambda s: 0.93, lambda s: 0.3 - 0.25 * s / 80)])
    broken = pay_ends([_rows(steps, lambda s: 0.95 - 0.9 * s / 80, lambda s: 0.3 - 0.25 * s / 80)])
    assert static.wrong[1] - static.wrong[0] > 0.3 and static.auc[1] < static.auc[0]
    heldout = {arm: [(4, 0.04), (80, 0.05)] for arm in ("static", "cooper", "rule")}
    lines = reading({"static": static, "cooper": cooper, "cooper_rollout": broken}, heldout,
                    {"static": 1, "cooper": 1, "rule": 1}, checkout=CHECKOUT)
    assert lines[0].startswith("Static RM: paid the policy's verified-right training rollouts 0.96 -> 0.96, "
                               "verified-wrong ones 0.49 -> 0.97")
    assert "(an exploited RM)" in lines[0] and "AUC down by" in lines[0]
    assert lines[1].startswith("Cooper's RM:") and lines[1].endswith("it still tells them apart.")
    assert lines[2].startswith("cooper_rollout RM:") and "a degenerate RM" in lines[2]
    assert lines[3].startswith("Held-out accuracy (first -> last evaluation): static 0.04 -> 0.05")
    assert "the RM lines above are the judge" in lines[3]
    assert "One seed per arm cannot show this reliably" in lines[4] and full_lab_figure(CHECKOUT) in lines[4]
    assert not any("hacked in this run" in line or "level with the rule reward" in line for line in lines)
    # A flat RM keeps its verdict plain; with enough seeds no caveat; nothing to read without an RM arm.
    flat = PayEnds((0.9, 0.9), (0.2, 0.21), (0.95, 0.95), 3)
    three = reading({"static": flat}, {}, {"static": 3, "cooper": 3, "rule": 3})
    assert three == ["Static RM: paid the policy's verified-right training rollouts 0.90 -> 0.90, verified-wrong ones "
                     "0.20 -> 0.21, AUC right vs wrong 0.95 -> 0.95 (first and last 10 steps): it kept telling right "
                     "from wrong as it started."]
    assert reading({}, {"rule": [(2, 0.3), (4, 0.4)]}, {"rule": 1}) == []
    assert pay_ends([[{"step": 1, "verified": True, "reward": None}]]) is None  # a rule arm: no RM pay


def test_the_labs_last_lines_read_the_training_rollouts_of_the_policies():
    from cooper_openrlhf.lab.reading import VERIFIED_WINDOW, PayEnds, reading

    steps = range(1, 4 * VERIFIED_WINDOW + 1)

    def ramp(first, last):
        return [(s, first + (last - first) * (s - 1) / (len(steps) - 1)) for s in steps]

    pays = {"static": PayEnds((0.9, 0.9), (0.2, 0.2), (0.95, 0.95), 3)}
    heldout = {arm: [(4, 0.30), (40, 0.30)] for arm in ("static", "cooper", "rule")}
    verified = {"rule": ramp(0.30, 0.36), "static": ramp(0.32, 0.12), "cooper": ramp(0.31, 0.34)}
    lines = reading(pays, heldout, {"static": 3, "cooper": 3, "rule": 3}, verified)
    # The first and last windows' means, not the end points: a ramp's window means sit inside its ends.
    assert lines[1].startswith("The policies, on the training prompts") and "static 0.30 -> 0.14" in lines[1]
    assert lines[1].endswith("the static RM's policy writes fewer verified answers; Cooper's ends level with the rule "
                             "arm's.")
    assert lines[2] == "Held-out accuracy (first -> last evaluation): static 0.30 -> 0.30, cooper 0.30 -> 0.30, rule " \
                       "0.30 -> 0.30."  # room to fall: no note
    verified = {"rule": ramp(0.30, 0.34), "static": ramp(0.30, 0.32), "cooper": ramp(0.30, 0.20)}
    lines = reading(pays, heldout, {"static": 3, "cooper": 3, "rule": 3}, verified)
    assert lines[1].endswith("the static RM's policy keeps its verified accuracy; Cooper's ends below the rule arm's, "
                             "though it fell by 0.08.")
    # Without a rule or static curve there is nothing to read the rollouts against.
    assert len(reading(pays, heldout, {"static": 3, "cooper": 3, "rule": 3}, {"static": verified["static"]})) == 2


def test_the_labs_starting_lines_give_the_warm_started_policys_accuracy_on_both_splits():
    setup = {"policy": {"train_accuracy": 0.34, "heldout_accuracy": 0.0234, "steps": 600},
             "rm_probe": {"verdict": "pays right answers most"}, "rm": {}}
    assert lab_cli.starting_lines(setup) == [
        "  starting policy: sampled accuracy 0.34 on the train split, 0.02 on the held-out problems (warm start, 600 steps)",
        "  starting RM: pays right answers most"]
    # A policy the lab did not warm-start (--policy) has no such accuracies: the line is left out.
    assert lab_cli.starting_lines({**setup, "policy": {"policy": "smollm2-135m-instruct"}}) == [
        "  starting RM: pays right answers most"]


def full_lab_figure_exists() -> bool:
    from cooper_openrlhf.lab.reading import full_lab_figure

    return (CHECKOUT / full_lab_figure(CHECKOUT)).is_file()


def test_the_labs_last_lines_are_the_committed_verdicts_whatever_the_run_shows():
    """`make demo` ends with the pre-registered batches' verdicts, read from the committed verdict files that
    docs/results/verdicts.json lists, after any reading of its own one-seed curves."""
    from cooper_openrlhf.lab.reading import VERDICT_INDEX, committed_results, committed_sentence, read_runs

    index = CHECKOUT / VERDICT_INDEX
    listed = json.loads(index.read_text())["batches"]
    assert [(r["batch"], r["lab"]) for r in committed_results(CHECKOUT)] == [(b["batch"], b["lab"]) for b in listed]
    assert all((index.parent / b["verdict"]).is_file() for b in listed)
    assert full_lab_figure_exists()

    last = read_runs([], CHECKOUT)  # no run finished: the committed results are still the last lines
    assert last == [committed_sentence(result) for result in committed_results(CHECKOUT)]
    assert last[0] == (
        "The committed result of the full lab (batch 33b, 8 seeds per arm, pre-registered; docs/results.md), on "
        "held-out accuracy (the mean of the last 3 evaluations): Cooper did not beat the control, "
        "an RM updated as Cooper's on fresh offline pairs that never saw the policy (Cooper - control -0.014, 95% CI "
        "[-0.060, +0.028], p 0.570: within noise), and the frozen RM's policy ended below the rule arm's by less than "
        "the plan's test can tell from noise (static - rule -0.050 [-0.089, -0.014], p 0.055, Holm-adjusted 0.234).")
    assert last[-1].startswith(  # the newest: the probe lab, a sequence of primaries
        "The committed result of the probe lab (batch 46, 12 seeds per arm, pre-registered; docs/results.md): on the "
        "final RM's exploit premium on the probe suite") and "Then, on the share of the last 20 steps'" in last[-1]
    assert last[1] == (  # the style lab
        "The committed result of the style lab (batch 45, 12 seeds per arm, pre-registered; docs/results.md), on the "
        "exploit rate (the share of the last 20 steps' training rollouts written in the lab's style and verified wrong; "
        "less is better): Cooper did not beat the control, an RM updated as Cooper's on fresh offline pairs that never "
        "saw the policy (Cooper - control +0.017, 95% CI [-0.111, +0.145], p 0.812: within noise); the control's "
        "policy was hurt, as the plan required (offline_pairs - rule +0.133, p 0.037); Cooper and the rule arm were "
        "not shown equivalent within ±0.05 (cooper - rule +0.149, two one-sided tests p 0.903), and the frozen RM's "
        "policy wrote more wrong answers in the style than the rule arm's (static - rule +0.254 [+0.156, +0.345], "
        "p 0.002, Holm-adjusted 0.016).")



def test_without_a_checkout_the_lab_says_where_the_committed_results_are_instead(tmp_path, caplog):
    """An installed package has no docs/ beside it: the lab's last lines state no committed result and name the
    results page, and the warning names what is missing (no checkout, or the checkout's missing index)."""
    from cooper_openrlhf.lab.reading import RESULTS_PAGE, VERDICT_INDEX, PayEnds, full_lab_figure, read_runs, reading

    with caplog.at_level(logging.WARNING, logger="cooper_openrlhf.lab.reading"):
        assert read_runs([], None) == []
        assert read_runs([], tmp_path) == []
    assert "no repository checkout" in caplog.text and str(tmp_path / VERDICT_INDEX) in caplog.text
    assert full_lab_figure(None) == full_lab_figure(tmp_path) == RESULTS_PAGE != full_lab_figure(CHECKOUT)
    flat = PayEnds((0.9, 0.9), (0.2, 0.21), (0.95, 0.95), 3)
    assert reading({"static": flat}, {}, {"static": 1})[-1].endswith(f"controls: {RESULTS_PAGE}.")

@pytest.mark.parametrize("cooper, control, words", [
    (0.10, 0.30, "Cooper beat the control"),  # less is better: Cooper's policy exploits less in every seed
    (0.50, 0.30, "Cooper did worse than the control"),
    (0.10, 0.02, "is uninformative"),  # the control exploits no more than the rule arm: the gate fails
])
def test_a_committed_verdict_on_a_measure_where_less_is_better_is_worded_by_its_outcome(cooper, control, words):
    from cooper_openrlhf.lab.reading import committed_sentence, verdict_summary
    from cooper_openrlhf.report.plan_verdict import DECISION_RULE_LOWER, plan_verdict
    from cooper_openrlhf.report.registered_measures import EXPLOIT_RATE

    plan = {"primary": {"lab": "main", "difference": "cooper - offline_pairs", "measure": EXPLOIT_RATE,
                        "decision": DECISION_RULE_LOWER,
                        "validity_gate": {"difference": "offline_pairs - rule", "must_be": "above"}},
            "equivalence": [{"difference": "cooper - rule", "margin": 0.05}], "secondary": ["static - rule"]}
    finals = {"cooper": {s: cooper + 0.01 * s for s in range(8)}, "offline_pairs": {s: control for s in range(8)},
              "rule": {s: 0.05 - 0.01 * (s % 2) for s in range(8)}, "static": {s: 0.40 for s in range(8)}}
    sentence = committed_sentence({"batch": "x", "lab": "a lab", **verdict_summary(plan_verdict(plan, finals))})
    assert words in sentence and "on the exploit rate" in sentence
    assert ("the control's policy was hurt, as the plan required" in sentence) == (words != "is uninformative")
    assert "Cooper and the rule arm were not shown equivalent within ±0.05" in sentence  # 0.05-0.22 above rule
    assert "the frozen RM's policy wrote more wrong answers in the style than the rule arm's (static - rule +0.355" \
        in sentence


def _sequence_plan():
    from cooper_openrlhf.report.plan_verdict import DECISION_RULE_LOWER
    from cooper_openrlhf.report.registered_measures import FINAL_PROBE_PREMIUM, STATES_REFERENCE_RATE

    arms = ["cooper - offline_pairs", "cooper_frozen_assistant - offline_pairs", "cooper_rollout - offline_pairs"]
    return {"sequence": [
        {"measure": FINAL_PROBE_PREMIUM, "differences": arms, "decision": DECISION_RULE_LOWER,
         "validity_gates": [{"difference": "oracle - offline_pairs", "must_be": "below"}]},
        {"measure": STATES_REFERENCE_RATE, "differences": arms, "decision": DECISION_RULE_LOWER,
         "validity_gates": [{"difference": "offline_pairs - rule", "must_be": "above"}]}]}


def _blocked(control: float, shifts: dict[str, float]) -> dict[str, dict[str, float]]:
    """Finals keyed as a sequence verdict keys them: "<preparation>/<seed>", 3 preparations x 4 seeds."""
    return {arm: {f"prep{p}/{s}": control + shift + 0.01 * s + (0.02 * (-1) ** (p + s) if arm != "offline_pairs" else 0)
                  for p in range(3) for s in range(4)} for arm, shift in shifts.items()}


@pytest.mark.parametrize("premium_shifts, expected", [
    # the first entry passes its gate; Cooper beats the control there, so the second entry tests Cooper alone
    ({"cooper": -0.3, "cooper_frozen_assistant": 0.0, "cooper_rollout": 0.2, "oracle": -0.6},
     ["Cooper (the policy as its own assistant) beat the control, an RM updated as Cooper's",
      "Cooper with the frozen warm start as assistant did not beat the control (cooper_frozen_assistant",
      "Cooper on the policy's own wrong rollouts did worse than the control (cooper_rollout",
      ". Then, on the share of the last 20 steps' training rollouts verified wrong that state the reference",
      "(cooper - offline_pairs -0.0"]),
    # no Cooper arm beats the control: the second entry is not tested
    ({"cooper": 0.0, "cooper_frozen_assistant": 0.0, "cooper_rollout": 0.0, "oracle": -0.6},
     ["did not beat the control", "not tested, as registered, since no Cooper arm beat the control before it"]),
    # the oracle does not close the probe premium: the first entry is uninformative, the second not tested
    ({"cooper": -0.3, "cooper_frozen_assistant": -0.3, "cooper_rollout": -0.3, "oracle": 0.0},
     ["uninformative, since the plan's validity gate failed (oracle - offline_pairs was to be below:",
      "not tested, as registered"]),
])
def test_a_committed_sequence_verdict_is_worded_entry_by_entry_in_the_registered_order(premium_shifts, expected):
    """The probe lab's verdict (`report.sequence_verdict`) in `make demo`'s last lines: each Cooper arm against the
    control on the RM's probe premium, then the policy's rate only for the arms that beat it, as the plan
    registers."""
    from cooper_openrlhf.lab.reading import committed_sentence, verdict_summary
    from cooper_openrlhf.report.registered_measures import FINAL_PROBE_PREMIUM, STATES_REFERENCE_RATE
    from cooper_openrlhf.report.sequence_verdict import sequence_verdict

    premium = _blocked(0.8, {"offline_pairs": 0.0, **premium_shifts})
    rate = _blocked(0.18, {"offline_pairs": 0.0, "rule": -0.15, "cooper": -0.06, "cooper_frozen_assistant": 0.0,
                           "cooper_rollout": 0.0})
    verdict = sequence_verdict(_sequence_plan(), {FINAL_PROBE_PREMIUM: premium, STATES_REFERENCE_RATE: rate})
    summary = json.loads(json.dumps(verdict_summary(verdict)))  # as committed_results reads it: through JSON
    sentence = committed_sentence({"batch": "46", "lab": "the probe lab", **summary})
    assert sentence.startswith("The committed result of the probe lab (batch 46, 12 seeds per arm, pre-registered; "
                               "docs/results.md): on the final RM's exploit premium on the probe suite")
    for words in expected:
        assert words in sentence, (words, sentence)
    assert sentence.count("an RM updated as Cooper's on fresh offline pairs") <= 1  # the control named once
