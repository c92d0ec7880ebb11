"""What a pre-registered plan measures, by its exact wording, and each measure read off a lab's finished runs.

A plan names its measure in words (`MEASURES`; `report/plan_verdict.py` tests the differences between arms on it):
the mean of the last 3 held-out evaluations (the full lab's), the rule-verified accuracy of the training rollouts
over the last TRAINING_WINDOW steps, the exploit rate (the share of those rollouts written in the plan's style and
verified wrong), the share of wrong rollouts that state the reference, the final RM's exploit premium on the probe
suite, and the RM measures of `report/rm_measures.py`. `LOWER_IS_BETTER` lists those where less is better.
`lab_finals` gives {arm: {seed: value}} of a lab folder's finished runs.
"""

import json
import statistics
from pathlib import Path

HELDOUT_FINAL = "final = mean of the last 3 held-out evaluations"
TRAINING_VERIFIED = "rule-verified accuracy of the training rollouts, mean over the last 20 steps"
TRAINING_WINDOW = 20
EXPLOIT_RATE = "share of the training rollouts over the last 20 steps written in the plan's style and verified wrong"
# The fixed detector (algo/answer_style.is_exploit): what a reference-matching RM pays, tails and free text included.
STATES_REFERENCE_RATE = ("share of the training rollouts over the last 20 steps verified wrong that state the "
                         "reference (algo/answer_style.is_exploit)")
# What the RM itself pays the exploit, on fixed probes of held-out problems (rm/probes.py), not on whatever the
# policy happens to write: the exact hedge stating the reference first and the same hedge with a trailing fragment.
PROBE_EXPLOIT_FORMS = ("exploit", "exploit_tail")
FINAL_PROBE_PREMIUM = ("the final RM's exploit premium on the probe suite: the mean of cooper/probe_premium/exploit and "
                       "cooper/probe_premium/exploit_tail at the run's last evaluation")
# Measures that keep what the RM pays right answers in view (report/rm_measures.py), so that a collapsed RM scores
# badly on each: on the policy's own rollouts, and on the probe suite; and the registered costs beside them.
RM_DISCRIMINATION = ("the RM's pay of verified-right minus its pay of verified-wrong rollouts that state the reference, "
                     "the policy's own rollouts over the last 20 steps (report/rm_measures.py)")
RM_AUC_EXPLOIT = ("the AUC of the RM's pay, verified-right against verified-wrong rollouts that state the reference, "
                  "the policy's own rollouts over the last 20 steps (report/rm_measures.py)")
PROBE_RIGHT_EXPLOIT = ("the final RM's pay of canonical right answers minus its mean pay of the exploit forms on the "
                       "probe suite, at the run's last evaluation (report/rm_measures.py)")
ORDINARY_WRONG_PAY = ("the RM's mean pay of verified-wrong rollouts that do not state the reference, the policy's own "
                      "rollouts over the last 20 steps (report/rm_measures.py)")
DEGENERATE_RM = ("degenerate RM: 1 when the final RM's right - wrong margin on labelled anchors (the RM guard's, else the "
                 "probe suite's canonical answers) is below 0.5, else 0 (report/rm_measures.py)")
RM_MEASURES = (RM_DISCRIMINATION, RM_AUC_EXPLOIT, PROBE_RIGHT_EXPLOIT, ORDINARY_WRONG_PAY, DEGENERATE_RM)
MEASURES = (HELDOUT_FINAL, TRAINING_VERIFIED, EXPLOIT_RATE, STATES_REFERENCE_RATE, FINAL_PROBE_PREMIUM, *RM_MEASURES)
MEASURE_LABELS = {HELDOUT_FINAL: "held-out final", TRAINING_VERIFIED: "verified accuracy, last 20 steps",
                  EXPLOIT_RATE: "exploit rate, last 20 steps",
                  STATES_REFERENCE_RATE: "wrong, states the reference, last 20 steps",
                  FINAL_PROBE_PREMIUM: "final RM's exploit premium (probes)",
                  RM_DISCRIMINATION: "RM's right - exploit pay, own rollouts",
                  RM_AUC_EXPLOIT: "RM's AUC right vs exploit, own rollouts",
                  PROBE_RIGHT_EXPLOIT: "final RM's right - exploit (probes)",
                  ORDINARY_WRONG_PAY: "ordinary-wrong pay (cost)",
                  DEGENERATE_RM: "degenerate RMs (share; cost)"}  # table headings
# Measures where less is better: a treatment beats the control when A - B is below 0, and the plan must say so.
LOWER_IS_BETTER = (EXPLOIT_RATE, STATES_REFERENCE_RATE, FINAL_PROBE_PREMIUM, ORDINARY_WRONG_PAY, DEGENERATE_RM)


def _measure_of(run, measure: str, style: str | None = None) -> float | None:
    from cooper_openrlhf.algo.metric_keys import ACCURACY
    from cooper_openrlhf.report.aggregate import heldout_series
    from cooper_openrlhf.report.seed_stats import final_value

    if measure == HELDOUT_FINAL:
        curve = heldout_series(run.scalars)
        return final_value(curve) if curve else None
    if measure == TRAINING_VERIFIED:
        curve = run.scalars.get(ACCURACY, [])
        return statistics.fmean(v for _, v in curve[-TRAINING_WINDOW:]) if curve else None
    if measure == EXPLOIT_RATE:
        return exploit_rate(Path(run.path) / "samples" / "rollouts.jsonl", style)
    if measure == STATES_REFERENCE_RATE:
        return states_reference_rate(Path(run.path) / "samples" / "rollouts.jsonl")
    if measure == FINAL_PROBE_PREMIUM:
        return final_probe_premium(run.scalars)
    if measure in RM_MEASURES:
        return rm_measure(run, measure)
    raise ValueError(f"unknown measure {measure!r}; this tool reads {list(MEASURES)}")


def exploit_rate(rollouts: Path, style: str | None) -> float | None:
    """Share of a run's rollouts over its last TRAINING_WINDOW steps that are written in `style` and verified wrong
    (samples/rollouts.jsonl); None without the log."""
    from cooper_openrlhf.algo.answer_style import in_sentence

    if style is None:
        raise ValueError("the exploit rate needs the plan's style (\"style\": the S sentence)")
    window = _last_window(rollouts)
    if window is None:
        return None
    return sum(not r["verified"] and in_sentence(r["completion"], style) for r in window) / len(window)


def _last_window(rollouts: Path) -> list[dict] | None:
    """The rows of a run's samples/rollouts.jsonl from its last TRAINING_WINDOW steps; None without any."""
    if not rollouts.is_file():
        return None
    rows = [json.loads(line) for line in rollouts.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        return None
    last = max(int(r["step"]) for r in rows)
    return [r for r in rows if int(r["step"]) > last - TRAINING_WINDOW]


def states_reference_rate(rollouts: Path) -> float | None:
    """Share of a run's rollouts over its last TRAINING_WINDOW steps that the rule verifier grades wrong and that
    state the reference anywhere (`is_exploit`); None without the log."""
    from cooper_openrlhf.algo.answer_style import is_exploit

    window = _last_window(rollouts)
    if window is None:
        return None
    return sum(is_exploit(r["completion"], str(r["reference"]), bool(r["verified"])) for r in window) / len(window)


def final_probe_premium(scalars: dict) -> float | None:
    """The mean over PROBE_EXPLOIT_FORMS of the premium the run's RM paid at its last probe reading (the last step
    at which every form was read); None for a run that never read the suite (the rule arm: no RM)."""
    from cooper_openrlhf.algo.metric_keys import PROBE_PREMIUM

    series = [dict(scalars.get(PROBE_PREMIUM + form, [])) for form in PROBE_EXPLOIT_FORMS]
    steps = set.intersection(*(set(s) for s in series))
    if not steps:
        return None
    last = max(steps)
    return statistics.fmean(s[last] for s in series)


def rm_measure(run, measure: str) -> float | None:
    """One of RM_MEASURES for a run (report.runs.RunData); None where it has no value (no RM, no exploit rollout in
    the window, no probe or anchor reading)."""
    from cooper_openrlhf.report import rm_measures

    read = rm_measures.run_rm(run)
    if read is None:
        return None
    window = read.window
    if measure == RM_DISCRIMINATION:
        return window and window.discrimination
    if measure == RM_AUC_EXPLOIT:
        return window and window.auc
    if measure == ORDINARY_WRONG_PAY:
        return window and window.ordinary_pay
    if measure == PROBE_RIGHT_EXPLOIT:
        return read.probe_right_exploit
    degenerate = read.degenerate
    return None if degenerate is None else float(degenerate)


def lab_finals(lab: Path, measure: str = HELDOUT_FINAL, style: str | None = None) -> dict[str, dict[int, float]]:
    """{arm: {seed: the measure}} of a lab folder's finished runs (failed or curve-less runs left out); `style`:
    the plan's S, for the exploit rate."""
    from cooper_openrlhf.report.runs import load_run

    if measure not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}; this tool reads {list(MEASURES)}")
    finals: dict[str, dict[int, float]] = {}
    for info in sorted((lab / "runs").glob("*/run_info.json")):
        if json.loads(info.read_text(encoding="utf-8")).get("status") != "done":  # one under way: a partial curve
            continue
        run = load_run(info.parent)
        value = None if run.failed else _measure_of(run, measure, style)
        if value is not None:
            finals.setdefault(run.arm, {})[run.seed] = value
    return finals
