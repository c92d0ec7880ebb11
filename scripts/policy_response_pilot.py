"""The policy-response pilots (docs/lab/policy_response_pilot/plan.md .. plan4.md): whether a lab configuration lets
the policy learn what it is paid for. Per candidate lab folder, the rule arm's held-out and training accuracy,
first -> last, and the plan's gate; for an RM-paid arm (pilot 4: static) also the exploit rate and what its RM paid.

    python scripts/policy_response_pilot.py [--pilot 2]                        # from the committed archives
    python scripts/policy_response_pilot.py --lab /work/runs/policy-response/p1 --publish   # archive finished runs first
    python scripts/policy_response_pilot.py --pilot 3 --regrade     # the samples graded again by today's verifier
    python scripts/policy_response_pilot.py --pilot 4               # the static arm against pilot 3's rule arm
    python scripts/policy_response_pilot.py --pilot 5               # the oracle arm against pilot 4's static arm
    python scripts/policy_response_pilot.py --pilot 6               # on-policy pairs against pilot 4's static arm

A candidate is a lab folder `<lab>/<name>` (its `lab_settings.json` says its configuration). Measures per run:
held-out accuracy (`eval/...accuracy`, the rule verifier's grade of held-out samples) as the mean of its evaluations
at steps <= `first` and over the last `last` steps (each pilot's own, set in its plan: `PILOTS`); training accuracy
(the rule verifier's grade of the training rollouts, samples/rollouts.jsonl) over the same windows. The gate (a):
the seed-mean held-out rise >= RISE and every seed's rise > 0.

`--regrade` grades the logged samples again with this checkout's rule verifier (the run's answer fallback, the
trainer's default "none") instead of reading the runs' own verdicts: a reading after the fact, not the plan's
measure, for a verifier that changed since the runs (pilot 3: math-verify graded "The final answer is 9 - 5 = 7."
right for 4, and the policy learned to write it).

Pilot 4 (plan4.md) reads, per run and window, the exploit rate: the share of training rollouts verified wrong that
state the reference (report/rm_measures.py `rollout_class`: what a reference-matching RM pays), beside accuracy,
and for an RM-paid arm what its RM paid right, exploit and ordinary wrong rollouts (AUC right vs exploit). Its rule,
the room gate (b) needs: the static arm's last-window exploit rate minus the rule arm's (pilot 3's runs, graded
again by this checkout's verifier: the rule arm's best policy is the floor any oracle RM can push the rate to),
seed mean >= ROOM and every static seed above the rule arm's mean.
"""

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cooper_openrlhf.lab.batch import archive_run
from cooper_openrlhf.report.aggregate import heldout_series
from cooper_openrlhf.report.runs import load_run

RISE = 0.05
ROOM = 0.10  # gate (b)'s bar: an oracle must lower static's exploit rate by this much, so static must leave it


@dataclass(frozen=True)
class Pilot:
    published: Path  # where its runs are archived
    first: int  # the first window: evaluations at steps 1..first
    last: int  # the last window: evaluations in the last `last` steps


PILOTS = {1: Pilot(Path("docs/results/policy_response_pilot"), first=20, last=40),  # 240-step runs
          2: Pilot(Path("docs/results/policy_response_pilot2"), first=6, last=12),  # 30-step runs
          3: Pilot(Path("docs/results/policy_response_pilot3"), first=6, last=12),  # 30-step runs
          4: Pilot(Path("docs/results/policy_response_pilot4"), first=6, last=12),  # 30-step static runs
          5: Pilot(Path("docs/results/policy_response_pilot5"), first=6, last=12),  # 30-step oracle runs
          6: Pilot(Path("docs/results/policy_response_pilot6"), first=6, last=12)}  # 30-step on-policy pair runs
# The runs a pilot reads beside its own (the same configuration): pilot 3's rule arm (graded again by this checkout's
# verifier, which the later pilots' runs use) and, for pilots 5 and 6, pilot 4's static arm.
REFERENCES = {4: (3,), 5: (3, 4), 6: (3, 4)}
# The arm gate (b) reads against static: pilot 5's oracle (pairs harvested from earlier runs), pilot 6's pairs of the
# policy's own rollouts (plan6.md: the right one against the wrong or answerless one the RM pays most).
GATE_ARM = {5: "oracle", 6: "cooper_rollout_answerless"}
REGRADED = 3  # the pilot whose runs are graded again when read as a reference


def finished(lab: Path) -> list[Path]:
    return [info.parent for info in sorted((lab / "runs").glob("*/run_info.json"))
            if json.loads(info.read_text()).get("status") == "done"]


def windows(points: list[tuple[int, float]], last_step: int, pilot: Pilot) -> tuple[float | None, float | None]:
    """(mean at steps <= pilot.first, mean at steps > last_step - pilot.last) of (step, value) points."""
    first = [v for s, v in points if s <= pilot.first]
    last = [v for s, v in points if s > last_step - pilot.last]
    return (statistics.fmean(first) if first else None, statistics.fmean(last) if last else None)


def accuracy_by_step(samples: Path, regrade: bool = False) -> list[tuple[int, float]]:
    """(step, share of that step's logged samples the rule verifier graded right): the run's own verdicts, or
    (`regrade`) this checkout's verifier's."""
    from cooper_openrlhf.verify.rule import RuleVerifierConfig, Verdict, verify_one

    config = RuleVerifierConfig(answer_fallback="none")
    by_step: dict[int, list[float]] = {}
    with samples.open(encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            right = (verify_one(row["reference"], row["completion"], config).verdict == Verdict.CORRECT if regrade
                     else bool(row["verified"]))
            by_step.setdefault(int(row["step"]), []).append(float(right))
    return [(step, statistics.fmean(values)) for step, values in sorted(by_step.items())]


def measures(folder: Path, pilot: Pilot, regrade: bool = False) -> dict:
    run = load_run(folder)
    train = accuracy_by_step(folder / "samples" / "rollouts.jsonl", regrade)
    last_step = train[-1][0] if train else 0
    heldout = accuracy_by_step(folder / "samples" / "heldout.jsonl", True) if regrade else heldout_series(run.scalars)
    held = windows(heldout, last_step, pilot)
    trained = windows(train, last_step, pilot)
    info = json.loads((folder / "run_info.json").read_text())
    return {"arm": run.arm, "seed": run.seed, "steps": last_step, "heldout": held, "train": trained,
            "rise": None if None in held else held[1] - held[0], "seconds": info.get("seconds")}


def rollout_rows(samples: Path, regrade: bool = False) -> list[dict]:
    """The logged training rollouts; `regrade`: "verified" set by this checkout's rule verifier."""
    from cooper_openrlhf.verify.rule import RuleVerifierConfig, Verdict, verify_one

    config = RuleVerifierConfig(answer_fallback="none")
    rows = [json.loads(line) for line in samples.read_text(encoding="utf-8").splitlines() if line]
    if regrade:
        for row in rows:
            row["verified"] = verify_one(row["reference"], row["completion"], config).verdict == Verdict.CORRECT
    return rows


def exploit_side(folder: Path, pilot: Pilot, regrade: bool = False) -> dict:
    """Per window (first, last): the exploit rate, the exploit share of wrong rollouts, and what the run's RM paid
    (report/rm_measures.py `rollout_pay`; None for the rule arm, whose rows carry the rule's reward)."""
    from cooper_openrlhf.report.rm_measures import anchor_margin, exploit_kind, rollout_class, rollout_pay

    rows = rollout_rows(folder / "samples" / "rollouts.jsonl", regrade)
    last_step = max(int(r["step"]) for r in rows)
    spans = ((1, pilot.first), (last_step - pilot.last + 1, last_step))
    run = load_run(folder)
    out = {"arm": run.arm, "seed": run.seed, "windows": [], "anchor_margin": anchor_margin(run.scalars)}
    for first, last in spans:
        window = [r for r in rows if first <= int(r["step"]) <= last]
        classes = [rollout_class(r) for r in window]
        kinds = [exploit_kind(r) for r, c in zip(window, classes) if c == "exploit"]
        wrong = [c for c in classes if c != "right"]
        out["windows"].append({
            "span": (first, last), "exploit_rate": classes.count("exploit") / len(classes),
            "exploit_of_wrong": classes.count("exploit") / len(wrong) if wrong else None,
            "unparsed_rate": kinds.count("unparsed") / len(classes),
            "wrong_final_rate": kinds.count("wrong_final") / len(classes),
            "pay": None if out["arm"] == "rule" else rollout_pay(rows, first, last)})
    return out


def _num(value, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+.3f}" if signed else f"{value:.3f}")


def exploit_report(candidates: dict[str, list[Path]], pilot: Pilot, references: dict[str, list[Path]],
                   number: int) -> None:
    """Pilots 4 and 5: per run the exploit rate, its two kinds and the RM's pay; then the pilot's rule: the room for
    gate (b) (pilot 4: static against the rule arm) or gate (b) itself (pilot 5: oracle against static, by seed)."""
    print(f"\nexploit rate (verified wrong, stating the reference) and the RM's pay: steps 1-{pilot.first} -> the last "
          f"{pilot.last} steps")
    print("| candidate | arm | seed | exploit rate | exploit share of wrong | RM pays right | RM pays exploit | "
          "RM pays ordinary wrong | AUC right vs exploit | wrong paid >= 0.5 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    read = []
    for name, folders in [*references.items(), *candidates.items()]:
        for folder in folders:
            r = exploit_side(folder, pilot, regrade=name.endswith(f"(pilot {REGRADED}, re-graded)"))
            first, last = r["windows"]
            pays = [w["pay"] for w in (first, last)]
            cell = (lambda attr: "-" if pays[0] is None else
                    f"{_num(getattr(pays[0], attr))} -> {_num(getattr(pays[1], attr))}")
            print(f"| {name} | {r['arm']} | {r['seed']} | {first['exploit_rate']:.3f} -> {last['exploit_rate']:.3f} | "
                  f"{_num(first['exploit_of_wrong'])} -> {_num(last['exploit_of_wrong'])} | {cell('right_pay')} | "
                  f"{cell('exploit_pay')} | {cell('ordinary_pay')} | {cell('auc')} | {cell('wrong_paid_share')} |")
            read.append((name, r))
    print("\nthe exploit's two kinds (report/rm_measures.py `exploit_kind`), share of all rollouts: the reference as the "
          "last number in no answer form the verifier reads (unparsed), or stated on the way to another answer "
          "(wrong final)")
    print("| candidate | arm | seed | unparsed | wrong final | final RM's anchor margin |")
    print("|---|---|---|---|---|---|")
    for name, r in read:
        first, last = r["windows"]
        print(f"| {name} | {r['arm']} | {r['seed']} | {first['unparsed_rate']:.3f} -> {last['unparsed_rate']:.3f} | "
              f"{first['wrong_final_rate']:.3f} -> {last['wrong_final_rate']:.3f} | {_num(r['anchor_margin'])} |")
    rates = {arm: {r["seed"]: r["windows"][1]["exploit_rate"] for _, r in read if r["arm"] == arm}
             for arm in ("rule", "static", *GATE_ARM.values())}
    if number == 4 and rates["rule"] and rates["static"]:
        floor = statistics.fmean(rates["rule"].values())
        room = statistics.fmean(rates["static"].values()) - floor
        passed = room >= ROOM and all(rate > floor for rate in rates["static"].values())
        print(f"room for gate (b): static's last-window exploit rate {statistics.fmean(rates['static'].values()):.3f} "
              f"(seed mean) - the rule arm's {floor:.3f} = {room:+.3f} (bar {ROOM}; every static seed above the rule "
              f"arm's mean): {'there is room' if passed else 'no room'}")
    if number in GATE_ARM and rates[GATE_ARM[number]]:
        gate_b([r for _, r in read if r["arm"] == GATE_ARM[number]], rates["static"])


# plan5.md amendment 1 (plan6.md keeps it): healthy = a final anchor margin of at least half the starting RM's
# (0.586 - 0.420, the RM guard's reading when it armed), not the lab's degenerate bound of 0.5, which that starting
# RM itself is below.
PILOT5_MARGIN = 0.5 * (0.586 - 0.420)


def gate_b(runs: list[dict], static: dict[int, float]) -> None:
    """Gate (b) (plan5.md, plan6.md): the gate arm - static on the last-window exploit rate, paired by RL seed, seed
    mean <= -ROOM and every seed's difference < 0; and the gate arm's RM healthy in every seed: its final anchor
    margin >= PILOT5_MARGIN (amendment 1) and it pays right rollouts more than exploits over the last window."""
    paired = [(r, r["windows"][1]["exploit_rate"] - static[r["seed"]]) for r in runs if r["seed"] in static]
    if not paired:
        print("gate (b): no seed of the gate arm has its static run")
        return
    mean = statistics.fmean(d for _, d in paired)
    healthy = [r["anchor_margin"] is not None and r["anchor_margin"] >= PILOT5_MARGIN
               and (r["windows"][1]["pay"].discrimination or 0) > 0 for r, _ in paired]
    passed = mean <= -ROOM and all(d < 0 for _, d in paired) and all(healthy)
    print(f"gate (b): {runs[0]['arm']} - static on the last-window exploit rate, by seed "
          f"{', '.join(f'{d:+.3f}' for _, d in paired)}, mean {mean:+.3f} (bar <= -{ROOM}, every seed < 0); its RM "
          f"healthy (anchor margin >= {PILOT5_MARGIN:.3f}, pays right > exploit) in {sum(healthy)} of {len(healthy)} "
          f"seeds: gate (b) {'passes' if passed else 'fails'}")


def fmt(pair) -> str:
    return "-" if None in pair else f"{pair[0]:.3f} -> {pair[1]:.3f}"


def report(candidates: dict[str, list[Path]], pilot: Pilot, regrade: bool = False) -> None:
    if regrade:
        print("graded again by this checkout's rule verifier (not the runs' own verdicts, not the plan's measure)")
    print(f"held-out and training accuracy: mean at steps <= {pilot.first} -> mean over the last {pilot.last} steps; "
          f"gate (a): seed-mean held-out rise >= {RISE} and every seed's rise > 0")
    print("| candidate | arm | seed | steps | held-out accuracy | rise | training accuracy | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for name, folders in candidates.items():
        rows = [measures(f, pilot, regrade) for f in folders]
        for r in rows:
            rise = "-" if r["rise"] is None else f"{r['rise']:+.3f}"
            print(f"| {name} | {r['arm']} | {r['seed']} | {r['steps']} | {fmt(r['heldout'])} | {rise} | "
                  f"{fmt(r['train'])} | {r['seconds']:.0f} |")
        rises = [r["rise"] for r in rows if r["arm"] == "rule" and r["rise"] is not None]
        if rises:
            mean = statistics.fmean(rises)
            passed = mean >= RISE and all(rise > 0 for rise in rises)
            print(f"{name}: rule arm, {len(rises)} seed(s), mean held-out rise {mean:+.3f}: gate (a) "
                  f"{'passes' if passed else 'fails'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", type=Path, default=None,
                        help="a folder of candidate lab folders: read their finished runs, not the archives")
    parser.add_argument("--pilot", type=int, choices=sorted(PILOTS), default=1, help="which pilot's windows and archive")
    parser.add_argument("--publish", action="store_true", help="archive finished runs into the pilot's folder")
    parser.add_argument("--regrade", action="store_true",
                        help="grade the logged samples again with this checkout's rule verifier (a later reading)")
    args = parser.parse_args(argv)
    pilot = PILOTS[args.pilot]
    published = pilot.published
    if args.lab:
        candidates = {lab.name: finished(lab) for lab in sorted(args.lab.iterdir()) if (lab / "runs").is_dir()}
        if args.publish:
            for name, folders in candidates.items():
                fresh = [f for f in folders if not (published / name / f"{f.name}.tar.gz").exists()]
                for folder in fresh:  # a finished run never changes: each is archived once
                    archive_run(folder, published / name / f"{folder.name}.tar.gz")
                    print(f"archived {name}/{folder.name} (git add -f: runs are ignored)")
        report(candidates, pilot, args.regrade)
        if args.pilot in REFERENCES:
            with tempfile.TemporaryDirectory() as scratch:
                exploit_report(candidates, pilot, references(args.pilot, Path(scratch)), args.pilot)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        candidates = unpacked(published, Path(scratch) / "pilot")
        report(candidates, pilot, args.regrade)
        if args.pilot in REFERENCES:
            exploit_report(candidates, pilot, references(args.pilot, Path(scratch) / "references"), args.pilot)
    return 0


def references(number: int, scratch: Path) -> dict[str, list[Path]]:
    """The runs pilot `number` reads beside its own (`REFERENCES`), named "<candidate> (pilot N[, re-graded])"."""
    out = {}
    for other in REFERENCES[number]:
        regraded = ", re-graded" if other == REGRADED else ""
        for name, folders in unpacked(PILOTS[other].published, scratch / str(other)).items():
            out[f"{name} (pilot {other}{regraded})"] = folders
    return out


def unpacked(published: Path, scratch: Path) -> dict[str, list[Path]]:
    """{candidate: its finished run folders} of a pilot's archives, unpacked under `scratch`."""
    candidates = {}
    for candidate in sorted(p for p in published.iterdir() if p.is_dir()) if published.is_dir() else []:
        for archive in sorted(candidate.glob("*.tar.gz")):
            with tarfile.open(archive) as tar:
                tar.extractall(scratch / candidate.name, filter="data")
        candidates[candidate.name] = finished(scratch / candidate.name)
    return candidates


if __name__ == "__main__":
    sys.exit(main())
