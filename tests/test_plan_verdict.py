"""A pre-registered plan's test (report/plan_verdict.py, `cli.batch PLAN --verdict`) on hand-made finals: the primary
difference judged by the plan's own rule, secondary differences, the static-falls count, and the refusals."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cooper_openrlhf.report.plan_verdict import DECISION_RULE, plan_verdict, render
from cooper_openrlhf.report.registered_measures import lab_finals

PLAN = {
    "primary": {"lab": "main", "difference": "cooper - offline_pairs, paired by seed", "decision": DECISION_RULE},
    "secondary": ["cooper - static", "static falls: final below its seed's rule final by more than 0.05 (count of 8)",
                  "blind-spot dependence: final of static and cooper against the starting RM's climb"],
}
RULE = {s: 0.40 for s in range(8)}


def _finals(cooper_minus_control: list[float]) -> dict[str, dict[int, float]]:
    control = {s: 0.30 + 0.01 * s for s in range(8)}
    return {"offline_pairs": control, "cooper": {s: control[s] + d for s, d in enumerate(cooper_minus_control)},
            "rule": RULE, "static": {s: 0.40 - 0.1 * (s % 2) for s in range(8)}}


@pytest.mark.parametrize("differences, words", [
    ([0.05, 0.06, 0.04, 0.05, 0.07, 0.05, 0.06, 0.04], "beats the control"),  # every seed up: p = 2/256
    ([-0.05, -0.06, -0.04, -0.05, -0.07, -0.05, -0.06, -0.04], "worse than the control"),
    ([0.05, -0.06, 0.04, -0.05, 0.07, -0.05, 0.06, -0.04], "within noise"),
])
def test_the_primary_difference_is_judged_by_the_plans_rule(differences, words):
    verdict = plan_verdict(PLAN, _finals(differences))
    primary = verdict["primary"]
    assert primary["difference"] == "cooper - offline_pairs" and primary["seeds"] == 8
    assert primary["mean"] == pytest.approx(sum(differences) / 8)
    assert primary["in_words"] == words
    if words != "within noise":
        assert primary["p"] == pytest.approx(2 / 256)  # exact sign flips: only all-up and all-down are as extreme


def test_on_a_measure_where_less_is_better_the_treatment_beats_the_control_below_it_and_the_plan_must_say_so():
    from cooper_openrlhf.report.plan_verdict import DECISION_RULE_LOWER
    from cooper_openrlhf.report.registered_measures import EXPLOIT_RATE

    lower = {**PLAN, "secondary": [], "primary": {**PLAN["primary"], "measure": EXPLOIT_RATE,
                                                  "decision": DECISION_RULE_LOWER}}
    down = [-0.05, -0.06, -0.04, -0.05, -0.07, -0.05, -0.06, -0.04]  # cooper exploits less in every seed
    verdict = plan_verdict(lower, _finals(down))
    assert verdict["primary"]["in_words"] == "beats the control"
    assert f"Decision rule (the plan's): {DECISION_RULE_LOWER}." in render(verdict)  # the rule it was judged by
    assert plan_verdict(lower, _finals([-d for d in down]))["primary"]["in_words"] == "worse than the control"
    with pytest.raises(ValueError, match="for its measure this tool decides by 'beats the control if CI upper end"):
        plan_verdict({**lower, "primary": {**lower["primary"], "decision": DECISION_RULE}}, _finals(down))


def test_an_interval_clear_of_zero_with_p_above_005_is_within_noise():
    # 4 seeds all up: the bootstrap interval excludes 0, but the exact sign-flip p is 2/16 = 0.125.
    finals = {"cooper": {s: 0.5 for s in range(4)}, "offline_pairs": {s: 0.4 - 0.01 * s for s in range(4)},
              "rule": RULE, "static": RULE}
    primary = plan_verdict({**PLAN, "secondary": []}, finals)["primary"]
    assert primary["ci"][0] > 0 and primary["p"] == pytest.approx(0.125)
    assert primary["in_words"] == "within noise"


def test_secondary_entries_the_static_falls_count_and_what_is_read_elsewhere():
    verdict = plan_verdict(PLAN, _finals([0.0] * 8))
    cooper_static, falls = verdict["secondary"]
    assert cooper_static["difference"] == "cooper - static" and cooper_static["in_words"] in (
        "cooper above static", "cooper below static", "within noise")
    assert falls["fell"] == [1, 3, 5, 7] and falls["seeds"] == 8 and falls["margin"] == 0.05  # 0.10 below rule
    assert verdict["elsewhere"] == [PLAN["secondary"][2]]
    text = render(verdict, "plan.json")
    assert "Static fell (final below its seed's rule final by more than 0.05) in 4 of 8 seeds: seeds 1, 3, 5, 7." in text
    assert "**Primary: cooper - offline_pairs = +0.000" in text


def test_a_plan_with_another_decision_rule_or_an_arm_without_runs_is_refused():
    with pytest.raises(ValueError, match="this tool decides by"):
        plan_verdict({**PLAN, "primary": {**PLAN["primary"], "decision": "beats the control if the mean > 0"}},
                     _finals([0.0] * 8))
    finals = _finals([0.0] * 8)
    del finals["offline_pairs"]
    with pytest.raises(ValueError, match=r"no finished run of offline_pairs"):
        plan_verdict(PLAN, finals)


def _run(lab: Path, arm: str, seed: int, status: str, accuracy: list[float]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    run = lab / "runs" / f"{arm}_seed{seed}"
    with SummaryWriter(str(run / "tensorboard")) as writer:
        for step, value in enumerate(accuracy, start=1):
            writer.add_scalar("eval/accuracy", value, step)
    (run / "run_info.json").write_text(json.dumps({"arm": arm, "seed": seed, "status": status}))


def test_only_finished_runs_count_and_the_cli_writes_the_verdict(tmp_path):
    lab = tmp_path / "out" / "main"
    for seed in range(3):
        _run(lab, "cooper", seed, "done", [0.2, 0.3, 0.4, 0.5])  # final: mean of the last 3 = 0.4
        _run(lab, "offline_pairs", seed, "done", [0.2, 0.2, 0.2, 0.2])
    _run(lab, "offline_pairs", 3, "running", [0.9])  # under way: its partial curve must not count
    assert lab_finals(lab) == {"cooper": {0: pytest.approx(0.4), 1: pytest.approx(0.4), 2: pytest.approx(0.4)},
                               "offline_pairs": {0: pytest.approx(0.2), 1: pytest.approx(0.2), 2: pytest.approx(0.2)}}

    plan = {**PLAN, "secondary": [], "out": str(tmp_path / "out"), "commit": "0" * 40,
            "labs": [{"name": "main", "seeds": 3, "args": ["--preset", "full"]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "verdict.md"
    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.batch", str(tmp_path / "plan.json"),
                             "--verdict", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "cooper - offline_pairs +0.200 over 3 seeds: within noise" in result.stdout  # 3 seeds: p >= 2/8
    assert json.loads(out.with_suffix(".json").read_text())["primary"]["seeds"] == 3

    bad = {**plan, "primary": {**plan["primary"], "difference": "cooper - static"}}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.batch", str(tmp_path / "bad.json"),
                             "--verdict", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "no finished run of static" in result.stderr


def test_the_verdict_reads_a_published_copy_of_the_batch_in_a_clone_that_never_ran_it(tmp_path):
    from cooper_openrlhf.lab.batch import archive_run

    lab = tmp_path / "ran" / "main"
    for seed in range(3):
        _run(lab, "cooper", seed, "done", [0.2, 0.3, 0.4, 0.5])
        _run(lab, "offline_pairs", seed, "done", [0.2, 0.2, 0.2, 0.2])
    published = tmp_path / "docs" / "main"
    for run in (lab / "runs").iterdir():
        archive_run(run, published / "runs" / f"{run.name}.tar.gz")
    (published / "lab.json").write_text(json.dumps({"setup": {"rm": {}}, "runs": [{"seconds": 1800}, {"seconds": 1800}]}))
    plan = {**PLAN, "secondary": [], "out": str(tmp_path / "never-ran"), "commit": "0" * 40,
            "labs": [{"name": "main", "seeds": 3, "args": ["--preset", "full"]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    command = [sys.executable, "-m", "cooper_openrlhf.cli.batch", str(tmp_path / "plan.json")]
    result = subprocess.run([*command, "--verdict", str(tmp_path / "v.md"), "--from-published", str(tmp_path / "docs")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "cooper - offline_pairs +0.200 over 3 seeds" in result.stdout
    assert not (tmp_path / "never-ran").exists()
    text = (tmp_path / "v.md").read_text()  # what the batch ran and what it cost, beside its test
    assert f"Configuration frozen at commit `{'0' * 40}`" in text and "took 1.0 h of run time in all" in text

    alone = subprocess.run([*command, "--from-published", str(tmp_path / "docs")], capture_output=True, text=True,
                           timeout=300)
    assert alone.returncode == 2 and "--from-published reads runs for --verdict" in alone.stderr


def test_a_style_plans_verdict_reads_the_exploit_rate_from_the_rollout_logs_and_draws_it_beside_the_verdict(tmp_path):
    from cooper_openrlhf.report.plan_verdict import DECISION_RULE_LOWER
    from cooper_openrlhf.report.registered_measures import EXPLOIT_RATE

    hedge = "The answer is {other}. The answer is {answer}."
    lab = tmp_path / "out" / "main"
    for seed in range(3):
        for arm, wrong_hedges in (("cooper", 1), ("offline_pairs", 3)):  # of 4 rollouts a step
            _run(lab, arm, seed, "done", [0.3, 0.3])
            rows = [{"step": step, "question": "What is 2 + 2?", "reference": "4", "reward": 0.9,
                     "completion": "The answer is 4. The answer is 5." if k < wrong_hedges else "The answer is 4.",
                     "verified": k >= wrong_hedges} for step in (1, 2) for k in range(4)]
            (lab / "runs" / f"{arm}_seed{seed}" / "samples").mkdir()
            (lab / "runs" / f"{arm}_seed{seed}" / "samples" / "rollouts.jsonl").write_text(
                "".join(json.dumps(row) + "\n" for row in rows))
    plan = {"primary": {"lab": "main", "difference": "cooper - offline_pairs, paired by seed", "measure": EXPLOIT_RATE,
                        "decision": DECISION_RULE_LOWER},
            "secondary": [], "style": hedge, "out": str(tmp_path / "out"), "commit": "0" * 40,
            "labs": [{"name": "main", "seeds": 3, "args": ["--preset", "style"]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.batch", str(tmp_path / "plan.json"),
                             "--verdict", str(tmp_path / "v" / "verdict.md")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "cooper - offline_pairs -0.500 over 3 seeds" in result.stdout  # 0.25 - 0.75 wrong hedges
    assert (tmp_path / "v" / "exploit_rate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![exploit rate](exploit_rate.png)" in (tmp_path / "v" / "verdict.md").read_text()


def test_secondary_differences_are_judged_with_holm_adjusted_p():
    from cooper_openrlhf.report.plan_verdict import holm_adjusted

    # The full lab's five secondary p-values: offline_pairs - static (0.047) was "apart" alone, not after Holm.
    assert holm_adjusted([0.078, 0.664, 0.539, 0.047, 0.055]) == pytest.approx([0.234, 1.0, 1.0, 0.235, 0.235],
                                                                                abs=1e-3)
    up = [0.05, 0.06, 0.04, 0.05, 0.07, 0.05, 0.06, 0.04]  # every seed up: p = 2/256 alone
    plan = {**PLAN, "secondary": ["cooper - offline_pairs", "cooper - rule", "static - rule"]}
    finals = _finals(up)
    finals["rule"] = {s: finals["offline_pairs"][s] + d for s, d in enumerate(up)}  # rule as far above as cooper
    verdict = plan_verdict(plan, finals)
    first = verdict["secondary"][0]
    assert first["p"] == pytest.approx(2 / 256) and first["p_holm"] == pytest.approx(3 * 2 / 256)
    assert first["in_words"] == "cooper above offline_pairs"
    assert "registered no correction" in render(verdict)
    assert "The plan registered this correction." in render(plan_verdict({**plan, "secondary_correction": "holm"}, finals))


def test_a_registered_equivalence_test_is_two_one_sided_sign_flip_tests_at_the_plans_margin():
    from cooper_openrlhf.report.seed_stats import equivalence_p_value

    small = [0.01, -0.01, 0.02, -0.02, 0.0, 0.01, -0.01, 0.0]
    assert equivalence_p_value(small, 0.05) == pytest.approx(1 / 256)  # every shifted difference on one side
    assert equivalence_p_value(small, 0.002) > 0.05  # a margin well inside the seeds' spread
    with pytest.raises(ValueError, match="margin must be > 0"):
        equivalence_p_value(small, 0.0)
    finals = {"cooper": {s: 0.4 + d for s, d in enumerate(small)}, "rule": {s: 0.4 for s in range(8)},
              "offline_pairs": {s: 0.3 for s in range(8)}}
    plan = {**PLAN, "secondary": [], "equivalence": [{"difference": "cooper - rule", "margin": 0.05}]}
    verdict = plan_verdict(plan, finals)
    assert verdict["equivalence"][0]["verdict"] == "equivalent"
    assert "two one-sided sign-flip tests at a margin of ±0.050: p = 0.004, equivalent." in render(verdict)


def test_the_training_rollouts_measure_is_the_mean_verified_accuracy_of_the_last_20_steps(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from cooper_openrlhf.report.registered_measures import TRAINING_VERIFIED

    run = tmp_path / "runs" / "rule_seed0"
    with SummaryWriter(str(run / "tensorboard")) as writer:
        for step in range(1, 41):
            writer.add_scalar("cooper/verified_accuracy", 0.2 if step <= 20 else 0.5, step)
            writer.add_scalar("eval/accuracy", 0.1, step)
    (run / "run_info.json").write_text(json.dumps({"arm": "rule", "seed": 0, "status": "done"}))
    assert lab_finals(tmp_path, TRAINING_VERIFIED) == {"rule": {0: pytest.approx(0.5)}}
    assert lab_finals(tmp_path) == {"rule": {0: pytest.approx(0.1)}}
    with pytest.raises(ValueError, match="unknown measure"):
        lab_finals(tmp_path, "best step")


def test_the_primary_counts_only_when_the_registered_validity_gate_shows_the_control_hurt():
    up = [0.05, 0.06, 0.04, 0.05, 0.07, 0.05, 0.06, 0.04]
    finals = _finals(up)  # offline_pairs 0.30-0.37, rule 0.40: the control below rule in every seed
    plan = {**PLAN, "secondary": [], "primary": {**PLAN["primary"],
                                                  "validity_gate": {"difference": "offline_pairs - rule", "must_be": "below"}}}
    verdict = plan_verdict(plan, finals)
    assert verdict["primary"]["validity_gate"]["passed"] and verdict["primary"]["in_words"] == "beats the control"
    finals["rule"] = {s: finals["offline_pairs"][s] + (0.01 if s % 2 else -0.01) for s in range(8)}  # not hurt
    verdict = plan_verdict(plan, finals)
    assert verdict["primary"]["verdict"] == "uninformative"
    assert verdict["primary"]["in_words"].startswith("uninformative: the validity gate failed (offline_pairs - rule")
    assert "failed, so the primary is uninformative" in render(verdict)


def test_the_style_labs_plan_is_frozen_read_by_this_tool_and_runs_the_style_preset_in_fp32():
    from cooper_openrlhf.cli import lab as lab_cli
    from cooper_openrlhf.lab.batch import load_plan
    from cooper_openrlhf.lab.presets import STYLE
    from cooper_openrlhf.report.plan_verdict import check_decision_rule, plan_measures
    from cooper_openrlhf.report.registered_measures import MEASURES

    plan = load_plan(Path(__file__).resolve().parents[1] / "docs" / "lab" / "batch45" / "plan.json")
    assert re.fullmatch(r"[0-9a-f]{40}", plan["commit"]) and "status" not in plan  # frozen: cli.batch runs it
    assert plan["environment"] == {"COOPER_CPU_BF16": "0"}
    check_decision_rule(plan)
    assert all(measure in MEASURES for measure in plan_measures(plan)) and plan["style"] == STYLE
    assert plan["secondary_correction"] == "holm" and plan["equivalence"][0]["margin"] > 0
    args = lab_cli.parse_args(plan["labs"][0]["args"])
    assert args.preset == "style" and set(args.arm_list) == {"rule", "static", "cooper", "offline_pairs", "cooper_stale"}


def test_the_verdict_states_each_arm_alone_in_every_measure_the_plan_reads():
    from cooper_openrlhf.report.registered_measures import TRAINING_VERIFIED

    plan = {**PLAN, "secondary": [{"difference": "cooper - rule", "measure": TRAINING_VERIFIED}]}
    finals = _finals([0.05, -0.06, 0.04, -0.05, 0.07, -0.05, 0.06, -0.04])
    verified = {arm: {s: 0.5 + 0.1 * (s % 2) for s in range(8)} for arm in ("cooper", "rule")}
    verdict = plan_verdict(plan, finals, {TRAINING_VERIFIED: verified})
    static = verdict["arms"]["final = mean of the last 3 held-out evaluations"]["static"]  # 0.4, 0.3 alternating
    assert static["seeds"] == 8 and static["mean"] == pytest.approx(0.35)
    assert static["sd"] == pytest.approx(0.0535, abs=1e-4) and static["ci"][0] < 0.35 < static["ci"][1]
    assert verdict["arms"][TRAINING_VERIFIED]["rule"]["mean"] == pytest.approx(0.55)
    assert "offline_pairs" not in verdict["arms"][TRAINING_VERIFIED]
    text = render(verdict)
    assert "| arm | held-out final | verified accuracy, last 20 steps |" in text
    assert f"verified accuracy, last 20 steps = {TRAINING_VERIFIED}" in text
    assert re.search(r"\| static \| 0\.350 ± 0\.053 \[0\.3\d\d, 0\.3\d\d\] \| - \|", text)
    assert re.search(r"\| rule \| 0\.400 ± 0\.000 \[0\.400, 0\.400\] \| 0\.550 ± 0\.053 \[0\.5\d\d, 0\.5\d\d\] \|", text)
