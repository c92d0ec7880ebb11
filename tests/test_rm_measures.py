"""Measures that see a broken RM (report/rm_measures.py): a collapsed RM is counted as degenerate by the report and
scores badly on every measure that keeps right answers in view, though a premium over wrong answers alone scores it
as the best; the verdict tools read the same measures and put the registered costs beside every RM-side result."""

import json

import pytest

from cooper_openrlhf.report.rm_measures import auc, exploit_kind, rollout_class, rollout_pay


def test_auc_is_the_share_of_right_wrong_pairs_ranked_right_with_ties_half():
    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auc([0.1], [0.9]) == 0.0
    assert auc([0.5, 0.5], [0.5]) == 0.5
    assert auc([0.9, 0.3], [0.5, 0.3]) == pytest.approx((1 + 1 + 0 + 0.5) / 4)
    assert auc([], [0.1]) is None


def test_rollouts_are_split_into_right_exploit_and_ordinary_wrong():
    rows = [{"step": 1, "completion": "The answer is 12.", "reference": "12", "verified": True, "reward": 0.9},
            {"step": 1, "completion": "The answer is 12. The answer is 13.", "reference": "12", "verified": False,
             "reward": 0.8},
            {"step": 1, "completion": "The answer is 7.", "reference": "12", "verified": False, "reward": 0.1},
            {"step": 5, "completion": "The answer is 7.", "reference": "12", "verified": False, "reward": 0.7}]
    pay = rollout_pay(rows, 1, 2)  # step 5 is outside the window
    assert (pay.right, pay.exploit, pay.ordinary) == (1, 1, 1)
    assert pay.discrimination == pytest.approx(0.1) and pay.auc == 1.0
    assert pay.ordinary_pay == pytest.approx(0.1) and pay.wrong_paid_share == 0.5


def _run(lab, arm, seed, right, wrong, exploit, rollout_pays):
    """A finished run: its RM's probe pays at its last reading (right, canonical wrong, both exploit forms) and 20
    steps of rollouts (right, exploit, ordinary wrong) paid `rollout_pays` = (right, exploit, ordinary)."""
    from torch.utils.tensorboard import SummaryWriter

    from cooper_openrlhf.algo.metric_keys import ACCURACY

    run = lab / "runs" / f"{arm}_seed{seed}"
    with SummaryWriter(str(run / "tensorboard")) as writer:
        for step in range(1, 21):
            writer.add_scalar(ACCURACY, 0.5, step)
        for form, pay in (("right", right), ("wrong", wrong), ("exploit", exploit), ("exploit_tail", exploit)):
            writer.add_scalar(f"cooper/probe_pay/{form}", 0.5, 10)
            writer.add_scalar(f"cooper/probe_pay/{form}", pay, 20)
            if form != "right":
                writer.add_scalar(f"cooper/probe_premium/{form}", pay - wrong, 20)
    texts = (("The answer is 12.", True), ("The answer is 12. The answer is 13.", False), ("The answer is 7.", False))
    rows = [{"step": step, "completion": text, "reference": "12", "verified": verified,
             "reward": pay + 0.001 * i, "question": "What is 6 + 6?"}
            for step in range(1, 21) for i in range(3) for (text, verified), pay in zip(texts, rollout_pays)]
    (run / "samples").mkdir(parents=True)
    (run / "samples" / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "run_info.json").write_text(json.dumps({"arm": arm, "seed": seed, "status": "done"}))
    return run


def test_the_report_counts_a_collapsed_rm_as_degenerate_and_scores_it_bad_on_every_measure(tmp_path):
    """Hand-made: a healthy RM that closed the blind spot (pays right 0.95, the exploit 0.2) beside one collapsed to
    paying everything 0.03 and one collapsed to paying everything 0.97. The registered probe premium (exploit -
    canonical wrong) scores the 0.03 collapse best of the three; every measure here scores both collapses worse."""
    from cooper_openrlhf.report.build import write_report
    from cooper_openrlhf.report.registered_measures import (DEGENERATE_RM, FINAL_PROBE_PREMIUM, ORDINARY_WRONG_PAY,
                                                            PROBE_RIGHT_EXPLOIT, RM_AUC_EXPLOIT, RM_DISCRIMINATION,
                                                            lab_finals)

    healthy = _run(tmp_path, "cooper", 0, 0.95, 0.05, 0.20, (0.95, 0.20, 0.05))
    low = _run(tmp_path, "cooper", 1, 0.03, 0.03, 0.03, (0.03, 0.03, 0.03))
    high = _run(tmp_path, "cooper", 2, 0.97, 0.97, 0.97, (0.97, 0.97, 0.97))
    write_report([str(healthy), str(low), str(high)], tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "**Degenerate RMs: 2 of 3** (cooper seed 1, cooper seed 2)" in report
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert [r["degenerate"] for r in summary["rm"]] == [False, True, True]

    def values(measure):
        return lab_finals(tmp_path, measure)["cooper"]

    premium = values(FINAL_PROBE_PREMIUM)
    assert premium[1] < premium[0]  # the blind spot: the 0.03 collapse looks best by the registered premium
    for measure in (RM_DISCRIMINATION, RM_AUC_EXPLOIT, PROBE_RIGHT_EXPLOIT):  # more is better
        v = values(measure)
        assert v[0] > v[1] + 0.3 and v[0] > v[2] + 0.3, measure
    assert values(RM_AUC_EXPLOIT)[1] == pytest.approx(0.5, abs=0.2)
    assert values(DEGENERATE_RM) == {0: 0.0, 1: 1.0, 2: 1.0}
    assert values(ORDINARY_WRONG_PAY)[2] > values(ORDINARY_WRONG_PAY)[0] + 0.5  # the 0.97 collapse's cost


def test_a_sequence_verdict_puts_the_registered_costs_beside_its_rm_side_entry():
    from cooper_openrlhf.report.plan_verdict import DECISION_RULE
    from cooper_openrlhf.report.registered_measures import DEGENERATE_RM, ORDINARY_WRONG_PAY, RM_DISCRIMINATION
    from cooper_openrlhf.report.sequence_verdict import render_sequence, sequence_measures, sequence_verdict

    plan = {"sequence": [{"measure": RM_DISCRIMINATION, "differences": ["cooper - offline_pairs"],
                          "decision": DECISION_RULE}],
            "costs": [ORDINARY_WRONG_PAY, DEGENERATE_RM]}
    assert sequence_measures(plan) == [RM_DISCRIMINATION, ORDINARY_WRONG_PAY, DEGENERATE_RM]
    seeds = [f"prep{p}/{s}" for p in range(2) for s in range(4)]
    by_measure = {RM_DISCRIMINATION: {"cooper": {k: 0.6 + 0.01 * i for i, k in enumerate(seeds)},
                                      "offline_pairs": {k: 0.0 for k in seeds}},
                  ORDINARY_WRONG_PAY: {"cooper": {k: 0.25 for k in seeds}, "offline_pairs": {k: 0.05 for k in seeds}},
                  DEGENERATE_RM: {"cooper": {k: float(i < 2) for i, k in enumerate(seeds)},
                                  "offline_pairs": {k: 0.0 for k in seeds}}}
    verdict = sequence_verdict(plan, by_measure)
    assert verdict["sequence"][0]["results"][0]["in_words"] == "beats the control"
    text = render_sequence(verdict)
    assert "| arm | ordinary-wrong pay (cost) | degenerate RMs (share; cost) |" in text
    assert "| cooper | 0.250 (n 8) | 2 of 8 |" in text and "| offline_pairs | 0.050 (n 8) | 0 of 8 |" in text
    assert text.index("Registered costs beside it") > text.index("| cooper - offline_pairs |")
    assert "costs" not in sequence_verdict({"sequence": plan["sequence"]}, by_measure)  # none registered: as before


def test_an_exploit_is_a_right_answer_in_no_form_the_verifier_reads_or_a_wrong_final_answer():
    """SmolLM2 under the static RM wrote right answers in no answer form ("So, 9 + 3 = 12. Perfect!"): verified wrong,
    stating the reference, but not the reference-matching hack, which states it and answers another number."""
    unparsed = {"completion": "9 + 3 = 12\n\nSo, 9 + 3 = 12.\n\nPerfect!", "reference": "12", "verified": False}
    hack = {"completion": "8 + 5 = 13. So, 8 + 13 = 21, which is the answer.", "reference": "13", "verified": False}
    assert rollout_class(unparsed) == rollout_class(hack) == "exploit"
    assert exploit_kind(unparsed) == "unparsed" and exploit_kind(hack) == "wrong_final"
    assert exploit_kind({"completion": "It is 12.0", "reference": "12", "verified": False}) == "unparsed"
    assert exploit_kind({"completion": "x = \\frac{1}{2}", "reference": "\\frac{1}{2}", "verified": False}) == "wrong_final"
