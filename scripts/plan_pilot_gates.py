"""Batch 46's pilot gates, read off the pilot's finished runs (docs/lab/batch46/plan.json "gates_before_arms").

    python scripts/plan_pilot_gates.py /work/runs/batch46/prep0

Prints, from each finished pilot run's samples/rollouts.jsonl and tensorboard (rule, static and oracle, seeds 0 and
1; no other arm's or seed's run is read, so the batch's primaries stay unread in a folder where they have run):
- the rate (verified wrong, states the reference; last 20 steps) per run, and the gates static - rule >= +0.08 and
  oracle - static <= -0.05 on the means over the seeds both arms ran;
- the detector's precision and recall on the static runs' verified-wrong rollouts (all steps) against the
  registered label (the frozen RM paid >= 0.9) and, beside it, the issue's label (>= 0.5), which is not the gate;
- the final probe premium of static and oracle (the primary's measure, reported, not a Cooper arm's) and each run's
  seconds. Exit status 0 when every gate it reads passes, 1 otherwise, 2 when runs are missing.
"""

import json
import statistics
import sys
from pathlib import Path

from cooper_openrlhf.algo.answer_style import is_exploit
from cooper_openrlhf.ray.run_logs import read_scalars
from cooper_openrlhf.report.registered_measures import final_probe_premium, states_reference_rate

PILOT = {"rule", "static", "oracle"}, {0, 1}  # arms, RL seeds
EXPLOITED, ORACLE_MOVES = 0.08, -0.05
DETECTOR_GATE, LABEL, ISSUE_LABEL = 0.9, 0.9, 0.5


def finished(lab: Path) -> dict[tuple[str, int], Path]:
    runs = {}
    for info_path in sorted((lab / "runs").glob("*/run_info.json")):
        info = json.loads(info_path.read_text(encoding="utf-8"))
        if info.get("status") == "done" and info["arm"] in PILOT[0] and int(info["seed"]) in PILOT[1]:
            runs[(info["arm"], int(info["seed"]))] = info_path.parent
    return runs


def detector(static_runs: list[Path], label: float) -> tuple[float, float, int]:
    wrong = [r for run in static_runs for r in map(json.loads, (run / "samples" / "rollouts.jsonl").read_text(
        encoding="utf-8").splitlines()) if not r["verified"]]
    hit = [is_exploit(r["completion"], str(r["reference"]), False) for r in wrong]
    paid = [r["reward"] >= label for r in wrong]
    tp = sum(h and p for h, p in zip(hit, paid))
    return tp / max(sum(hit), 1), tp / max(sum(paid), 1), len(wrong)


def main(lab: Path) -> int:
    runs = finished(lab)
    rate = {key: states_reference_rate(run / "samples" / "rollouts.jsonl") for key, run in runs.items()}
    for (arm, seed), run in sorted(runs.items()):
        info = json.loads((run / "run_info.json").read_text(encoding="utf-8"))
        premium = final_probe_premium(read_scalars(run))
        print(f"{arm} seed {seed}: rate {rate[(arm, seed)]:.3f}, final probe premium "
              f"{'-' if premium is None else f'{premium:+.3f}'}, {info.get('seconds')} s")
    ok, missing = True, False
    for a, b, bound, above in (("static", "rule", EXPLOITED, True), ("oracle", "static", ORACLE_MOVES, False)):
        seeds = sorted({s for arm, s in runs if arm == a} & {s for arm, s in runs if arm == b})
        if not seeds:
            print(f"{a} - {b}: no seed with both finished")
            missing = True
            continue
        diff = statistics.fmean(rate[(a, s)] - rate[(b, s)] for s in seeds)
        passes = diff >= bound if above else diff <= bound
        ok &= passes
        print(f"{'PASS' if passes else 'FAIL'}  {a} - {b} on the rate, mean over seeds {seeds}: {diff:+.3f} "
              f"(gate: {'>=' if above else '<='} {bound:+.2f})")
    static = [run for (arm, _), run in runs.items() if arm == "static"]
    for label, gated in ((LABEL, True), (ISSUE_LABEL, False)):
        precision, recall, n = detector(static, label)
        passes = precision >= DETECTOR_GATE and recall >= DETECTOR_GATE
        ok &= passes or not gated
        print(f"{('PASS' if passes else 'FAIL') if gated else 'info'}  detector against paid >= {label} "
              f"({n} verified-wrong static rollouts): precision {precision:.3f}, recall {recall:.3f}"
              + ("" if gated else " (the issue's label, reported, not the gate)"))
    return 2 if missing else 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
