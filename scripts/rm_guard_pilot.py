"""The RM guard and anchoring pilot (docs/lab/rm_guard_pilot/plan.md): its finished runs archived for the repository,
and every measure the plan names, per run and per arm; its decision rules once all 12 runs are done.

    python scripts/rm_guard_pilot.py                                   # from the committed archives
    python scripts/rm_guard_pilot.py --lab /work/runs/rm-guard-pilot/prep0 --publish   # archive finished runs first

Reads each finished run (run_info.json status "done"): its rollouts (samples/rollouts.jsonl) and scalars. Measures
(report/rm_measures.py): degenerate = final anchor margin (cooper/rm_health right - wrong pay) below 0.5; on the
policy's own rollouts, last 20 steps: the RM's pay of the exploit (wrong, stating the reference), right - exploit, its
AUC, ordinary-wrong pay; the last cooper/rm_eval_accuracy; the guard's rollbacks (the last cumulative count); the
run's seconds (run_info.json: the last attempt's, so a resumed run's covers only its resumed part) and its mean step
time (`timing/step_total`, every step it logged: what the plan's `timing/*` measure reads).
"""

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

from cooper_openrlhf.lab.batch import archive_run
from cooper_openrlhf.report.rm_measures import DEGENERATE_MARGIN, run_rm
from cooper_openrlhf.report.runs import load_run

PUBLISHED = Path("docs/results/rm_guard_pilot/prep0/runs")
ARMS = ("cooper_unguarded", "cooper", "cooper_anchored")
SEEDS = 4


def finished(lab: Path) -> list[Path]:
    runs = []
    for info in sorted((lab / "runs").glob("*/run_info.json")):
        if json.loads(info.read_text()).get("status") == "done":
            runs.append(info.parent)
    return runs


def measures(folder: Path) -> dict | None:
    """The plan's measures of one finished run; None for a run without an RM."""
    run = load_run(folder)
    read = run_rm(run)
    if read is None or read.window is None:
        return None
    w = read.window
    last = lambda key: run.scalars[key][-1][1] if run.scalars.get(key) else None  # noqa: E731
    info = json.loads((folder / "run_info.json").read_text())
    return {"arm": run.arm, "seed": run.seed, "margin": read.margin[1] if read.margin else None,
            "degenerate": read.degenerate, "exploit_pay": w.exploit_pay, "right_exploit": w.discrimination,
            "auc": w.auc, "ordinary_pay": w.ordinary_pay, "rm_eval": last("cooper/rm_eval_accuracy"),
            "rollbacks": last("cooper/rm_health/rollbacks"), "seconds": info.get("seconds"),
            "step_seconds": mean(value for _, value in run.scalars.get("timing/step_total", []))}


def fmt(value, signed=False) -> str:
    return "-" if value is None else f"{value:+.3f}" if signed else f"{value:.3f}"


def mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def decide(by_arm: dict[str, list[dict]]) -> list[str]:
    """The plan's two decision rules, only with all 4 seeds of every arm."""
    if any(len(by_arm.get(arm, [])) < SEEDS for arm in ARMS):
        return ["decision rules: not applied (the plan applies them once all 12 runs are done)"]
    count = {arm: sum(bool(r["degenerate"]) for r in by_arm[arm]) for arm in ARMS}
    m = {arm: {k: mean(r[k] for r in by_arm[arm]) for k in ("right_exploit", "ordinary_pay", "seconds")} for arm in ARMS}
    a, c = m["cooper_anchored"], m["cooper"]
    anchored = (count["cooper_anchored"] <= count["cooper"] and a["right_exploit"] >= c["right_exploit"] - 0.05
                and a["ordinary_pay"] <= c["ordinary_pay"] + 0.05 and a["seconds"] <= 1.2 * c["seconds"])
    if count["cooper_unguarded"] < 2:
        guard = "the pilot could not test the guard (fewer than 2 of 4 unguarded RMs degenerate)"
    elif count["cooper"] < count["cooper_unguarded"]:
        guard = "the guard as shipped prevented the collapse here"
    else:
        guard = "the guard as shipped did not prevent it; its bounds are the next question"
    return [f"anchor-weight default: {'1.0' if anchored else '0 (unchanged)'} (degenerate {count['cooper_anchored']} vs "
            f"{count['cooper']}; right - exploit {a['right_exploit']:+.3f} vs {c['right_exploit']:+.3f}; ordinary-wrong "
            f"pay {a['ordinary_pay']:.3f} vs {c['ordinary_pay']:.3f}; seconds {a['seconds']:.0f} vs {c['seconds']:.0f})",
            f"guard: {guard} (degenerate: unguarded {count['cooper_unguarded']}, guarded {count['cooper']})"]


def report(folders: list[Path]) -> None:
    rows = [r for r in map(measures, folders) if r is not None]
    print(f"degenerate = final anchor margin below {DEGENERATE_MARGIN}; rollout measures over the last 20 steps")
    print("| arm | seed | anchor margin | degenerate | exploit pay | right - exploit | AUC right vs exploit | "
          "ordinary-wrong pay | rm_eval accuracy | rollbacks | seconds | step seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    by_arm: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (ARMS.index(r["arm"]) if r["arm"] in ARMS else 9, r["seed"])):
        by_arm.setdefault(r["arm"], []).append(r)
        print(f"| {r['arm']} | {r['seed']} | {fmt(r['margin'], True)} | {r['degenerate']} | {fmt(r['exploit_pay'])} | "
              f"{fmt(r['right_exploit'], True)} | {fmt(r['auc'])} | {fmt(r['ordinary_pay'])} | {fmt(r['rm_eval'])} | "
              f"{'-' if r['rollbacks'] is None else int(r['rollbacks'])} | {r['seconds']:.0f} | {fmt(r['step_seconds'])} |")
    for arm, members in by_arm.items():
        print(f"{arm}: {len(members)} run(s), degenerate {sum(bool(r['degenerate']) for r in members)}; means: exploit pay "
              f"{fmt(mean(r['exploit_pay'] for r in members))}, right - exploit "
              f"{fmt(mean(r['right_exploit'] for r in members), True)}, AUC {fmt(mean(r['auc'] for r in members))}, "
              f"ordinary-wrong pay {fmt(mean(r['ordinary_pay'] for r in members))}, seconds "
              f"{mean(r['seconds'] for r in members):.0f}, step seconds {fmt(mean(r['step_seconds'] for r in members))}")
    print("\n".join(decide(by_arm)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", type=Path, default=None, help="read this lab folder's finished runs, not the archives")
    parser.add_argument("--publish", action="store_true", help=f"archive the lab's finished runs into {PUBLISHED}")
    args = parser.parse_args(argv)
    if args.lab:
        folders = finished(args.lab)
        if args.publish:
            fresh = [f for f in folders if not (PUBLISHED / f"{f.name}.tar.gz").exists()]  # a finished run never changes
            for folder in fresh:
                archive_run(folder, PUBLISHED / f"{folder.name}.tar.gz")
            print(f"archived {len(fresh)} newly finished run(s) into {PUBLISHED} (git add -f: runs/ is ignored)")
        report(folders)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        for archive in sorted(PUBLISHED.glob("*.tar.gz")):
            with tarfile.open(archive) as tar:
                tar.extractall(scratch, filter="data")
        report(finished(Path(scratch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
