"""Run a pre-registered lab batch: the plan's labs, resumable, each finished run's logs archived.

    cooper batch PLAN.json [--publish DIR [--commit-to REPO]]   # = python -m cooper_openrlhf.cli.batch

Runs the plan's labs (lab/batch.py) from the package it is started from, which must be the plan's commit (else a
clear error, nothing run); resumable (run it again); each finished run's small logs are archived under --publish,
and committed in the git worktree --commit-to (path-limited commits: nothing else of that worktree is touched).
"""

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path


PROG = "cooper batch"  # `python -m cooper_openrlhf.cli.batch` runs the same command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path, help="the plan (JSON: commit, out, labs)")
    parser.add_argument("--publish", type=Path, default=None,
                        help="archive finished runs and reports here; runs published there and missing from a lab "
                             "folder are restored into it first (a resume on a new machine)")
    parser.add_argument("--commit-to", type=Path, default=None,
                        help="with --publish: a git worktree holding it, where each seed's archives are committed")
    parser.add_argument("--parallel-runs", type=int, default=None, metavar="N",
                        help="run N of a seed's runs at once (cli.lab --parallel-runs): about one core each on a CPU "
                             "machine, so 2 on 2 cores finish a seed sooner; outside the plan, since it changes no "
                             "run's result")
    parser.add_argument("--check-only", action="store_true", help="check the plan against this worktree; run nothing")
    parser.add_argument("--blindspot-figure", type=Path, default=None, metavar="PNG",
                        help="run nothing: plot final held-out accuracy of static and cooper against the starting RM's "
                             "climb over the plan's labs (report/blindspot.py) into PNG, with its numbers beside it (.json)")
    parser.add_argument("--fingerprint", type=Path, default=None, metavar="DIR",
                        help="run nothing: hash each prepared lab's starting models (lab/batch.py "
                             "preparation_fingerprint); where DIR/<lab>/preparation.json exists, compare and exit 1 when "
                             "a file both hold differs (files only one side holds are counted, not compared), else "
                             "write it there")
    parser.add_argument("--verdict", type=Path, default=None, metavar="MD",
                        help="run nothing: the plan's test on its finished runs (report/plan_verdict.py: the primary "
                             "difference judged by the plan's decision rule, the secondary differences, how often static "
                             "fell) into MD, with its numbers beside it (.json)")
    parser.add_argument("--from-published", type=Path, default=None, metavar="DIR",
                        help="with --verdict or --blindspot-figure: read the runs from a published copy of the batch "
                             "(DIR/<lab>/lab.json and runs/*.tar.gz, as --publish writes them) instead of the plan's "
                             "out folder, e.g. the batch's folder under docs/results/ in a clone that never ran it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from cooper_openrlhf.cli import lab as lab_cli
    from cooper_openrlhf.lab.batch import PlanError, check_commit, load_plan, package_checkout, run_batch

    plan = load_plan(args.plan)
    if args.parallel_runs is not None and args.parallel_runs < 1:
        parser.error(f"--parallel-runs must be at least 1, got {args.parallel_runs}")
    if args.commit_to and not args.publish:
        parser.error("--commit-to commits what --publish archives; give --publish too")
    if args.from_published and not (args.verdict or args.blindspot_figure):
        parser.error("--from-published reads runs for --verdict or --blindspot-figure; it runs nothing itself")
    if args.verdict or args.blindspot_figure:
        logging.getLogger("tensorboard").setLevel(logging.WARNING)  # one "No path found" line per run read
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(plan["out"])
            if args.from_published:
                from cooper_openrlhf.lab.batch import unpack_published

                out = unpack_published(args.from_published, [lab["name"] for lab in plan["labs"]], Path(scratch))
            if args.blindspot_figure:
                _blindspot_figure(plan, out, args.blindspot_figure)
            return _verdict(plan, out, args.plan, args.verdict) if args.verdict else 0
    if args.fingerprint:
        return _fingerprint(plan, args.fingerprint)
    repo = package_checkout()
    if repo is None:
        raise PlanError(f"a batch runs from a git checkout at the plan's commit {plan['commit']}, and the package "
                        f"at {Path(lab_cli.__file__).parents[1]} is installed, in none: run it from a worktree at "
                        "that commit")
    if args.check_only:
        check_commit(repo, plan["commit"])
        print(f"plan {args.plan}: the package in {repo} is the plan's commit {plan['commit']}")
        return 0
    return 1 if run_batch(plan, repo, lab_cli.main, args.publish, args.commit_to, args.parallel_runs) else 0


def _blindspot_figure(plan: dict, out: Path, png: Path) -> None:
    from cooper_openrlhf.lab.arms import ARMS
    from cooper_openrlhf.report.blindspot import dependence_figure, dependence_points

    rows = dependence_points([out / lab["name"] for lab in plan["labs"] if (out / lab["name"] / "lab.json").is_file()])
    dependence_figure(rows, png, known_arms=ARMS)
    png.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(f"{png}: {len(rows)} (lab, arm) points")


def _verdict(plan: dict, out: Path, plan_path: Path, md: Path) -> int:
    if "sequence" in plan:
        return _sequence_verdict(plan, out, plan_path, md)
    from cooper_openrlhf.report.figures import STYLE_FIGURE
    from cooper_openrlhf.report.plan_verdict import plan_measures, plan_verdict, render, run_hours
    from cooper_openrlhf.report.registered_measures import lab_finals

    lab = out / plan["primary"]["lab"]
    try:
        primary, *others = plan_measures(plan)
        verdict = plan_verdict(plan, lab_finals(lab, primary, plan.get("style")),
                               {m: lab_finals(lab, m, plan.get("style")) for m in others})
    except ValueError as exc:
        print(f"{plan_path}: {exc} (runs read from {lab})", file=sys.stderr)
        return 2
    verdict["run_hours"] = round(run_hours([out / entry["name"] for entry in plan["labs"]]), 2)
    text = render(verdict, str(plan_path))
    if plan.get("style"):  # the exploit, step by step, beside the verdict on its last 20 steps
        figure = _style_figure(lab, plan["style"], md.with_name(STYLE_FIGURE))
        text += (f"\n![exploit rate]({figure.name})\n\nEvery run's share of rollouts written in the plan's style, "
                 "and in it and verified wrong (the exploit rate), step by step (report/figures.py `exploit_rate`).\n")
    md.write_text(text, encoding="utf-8")
    md.with_suffix(".json").write_text(json.dumps(verdict, indent=2) + "\n", encoding="utf-8")
    print(f"{md}: {verdict['primary']['difference']} {verdict['primary']['mean']:+.3f} "
          f"over {verdict['primary']['seeds']} seeds: {verdict['primary']['in_words']}")
    return 0


def _sequence_verdict(plan: dict, out: Path, plan_path: Path, md: Path) -> int:
    """A plan whose primaries form a fixed sequence over several preparations' labs (report/sequence_verdict.py)."""
    from cooper_openrlhf.report.plan_verdict import run_hours
    from cooper_openrlhf.report.sequence_verdict import (pooled_finals, render_sequence, sequence_measures,
                                                         sequence_verdict)

    try:
        by_measure = {m: pooled_finals(out, plan["labs"], m, plan.get("style")) for m in sequence_measures(plan)}
        verdict = sequence_verdict(plan, by_measure)
    except ValueError as exc:
        print(f"{plan_path}: {exc} (runs read from {out}/{{{','.join(lab['name'] for lab in plan['labs'])}}})",
              file=sys.stderr)
        return 2
    verdict["run_hours"] = round(run_hours([out / entry["name"] for entry in plan["labs"]]), 2)
    md.write_text(render_sequence(verdict, str(plan_path)), encoding="utf-8")
    md.with_suffix(".json").write_text(json.dumps(verdict, indent=2) + "\n", encoding="utf-8")
    first = verdict["sequence"][0]
    print(f"{md}: " + "; ".join(f"{r['difference']} {r['mean']:+.3f}: {r['in_words']}" for r in first["results"]))
    return 0


def _style_figure(lab: Path, style: str, png: Path) -> Path:
    from cooper_openrlhf.lab.arms import ARMS
    from cooper_openrlhf.report.figures import write_style_figure
    from cooper_openrlhf.report.runs import load_run

    runs = [load_run(info.parent, style) for info in sorted((lab / "runs").glob("*/run_info.json"))
            if json.loads(info.read_text(encoding="utf-8")).get("status") == "done"]
    return write_style_figure(runs, png, style, known_arms=ARMS)


def _fingerprint(plan: dict, published: Path) -> int:
    """Write or compare each prepared lab's preparation.json under `published` (a resume on a new machine)."""
    from cooper_openrlhf.lab.batch import compare_fingerprints, one_sided, preparation_fingerprint

    differs = False
    for lab in plan["labs"]:
        folder, record = Path(plan["out"]) / lab["name"], published / lab["name"] / "preparation.json"
        if not (folder / "policy").is_dir():
            print(f"{lab['name']}: not prepared yet in {folder}")
            continue
        here = preparation_fingerprint(folder)
        if record.is_file():
            published_record = json.loads(record.read_text(encoding="utf-8"))
            lines = compare_fingerprints(published_record, here)
            differs |= bool(lines)
            only_there, only_here = one_sided(published_record, here)
            print(f"{lab['name']}: " + ("the same preparation as " + str(record) if not lines else
                                        f"differs from {record}:\n  " + "\n  ".join(lines))
                  + (f" ({only_there} files only there, {only_here} only here: not compared)"
                     if only_there or only_here else ""))
        else:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps(here, indent=2) + "\n", encoding="utf-8")
            print(f"{lab['name']}: {len(here['files'])} files hashed into {record}")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
