"""Run the paper's arms on one machine, several seeds, and write one report (the reward-hacking lab).

`python -m cooper_openrlhf.cli.lab` runs the same command as `cooper lab`.

  cooper lab --preset quick                 # = cooper demo = make demo: rule / static / cooper, 1 seed
  cooper lab --preset full --out runs/lab   # 5 arms x 3 seeds
  cooper lab --preset full --prepare-only   # task, policy, starting RM and its probe only
  cooper lab --preset smollm2               # SmolLM2-135M-Instruct as the policy
  cooper lab --preset style --seeds 2       # the style lab: S paid as correct (docs/lab.md)
  cooper lab --preset full --rm DIR [--rm-lr 3e-4]   # your starting RM (and RM lr)
  cooper lab --preset full --rm-pair-steps 0  # the BCE recipe's RM without the pair stage
  cooper lab --preset full --require-answer   # every RM arm format-gated (answerless text paid 0)
  cooper lab --preset full --rm-pair-candidates 8   # a narrower blind-spot search (8 seeds)
  cooper lab --preset full --no-rm-answerless-data --rm-pair-candidates 8   # no cut-off answers
  cooper lab --preset full --publish docs/results/my-lab   # + a copy to commit (report/publish.py)

Stages, all under --out: the task files, the starting policy and the starting VerifyRM (lab/prepare.py),
then every arm x seed as a real `train_cooper` run (lab/runner.py), then `cli.report` over the runs
(report/, figures and a markdown table) and a short summary per arm on stdout. Run it again with the same
--out to resume: finished runs are kept, unfinished and failed ones are run again. A run that fails is
reported as failed (with its log) and the others still run. The report covers every finished run of the folder,
so `--seeds 6` or `--arms rule` on a finished lab reports its old runs with the new. docs/lab.md: the setup and its reasons.
"""

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from tqdm.contrib.logging import logging_redirect_tqdm

from cooper_openrlhf.algo.hacking_rules import named_rules
from cooper_openrlhf.lab.arms import ARMS
from cooper_openrlhf.lab.presets import NEEDS_PAIR_SOURCE, PRESETS, RESUMABLE_FIELDS, parse_arms
from cooper_openrlhf.lab.task import task_split
from cooper_openrlhf.runtime.secrets import WANDB_KEY_FROM_ENV

logger = logging.getLogger("cooper_openrlhf.lab")


PROG = "cooper lab"  # `python -m cooper_openrlhf.cli.lab` runs the same command


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick", help="lab size (docs/lab.md)")
    parser.add_argument("--arms", default=None, help=f"comma-separated subset of {', '.join(ARMS)} (default: the preset's)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per arm, 0..N-1 (default: the preset's)")
    parser.add_argument("--steps", type=int, default=None, help="RL steps per run (default: the preset's)")
    parser.add_argument("--max-operand", type=int, default=None, metavar="N",
                        help="the task's operands run 2..N (default: the preset's, 9: 100 digit sums and differences, "
                             "small enough for the tiny policy to memorise its train split); a wider family, e.g. 29, "
                             "asks whether held-out accuracy can rise")
    parser.add_argument("--heldout", type=int, default=None, metavar="N",
                        help="problems held out of RL, whole equivalence classes (default: the preset's)")
    parser.add_argument("--policy", default=None,
                        help="starting policy: a HF folder or a packaged model name (default: the preset's; "
                             "'warm-start' = the tiny Qwen2 the lab fine-tunes itself)")
    parser.add_argument("--rm", type=Path, default=None,
                        help="a VerifyRM folder every RM arm starts from, instead of training the preset's recipe")
    parser.add_argument("--rm-pair-steps", type=int, default=None,
                        help="steps of the starting RM's pair stage (lab/pair_stage.py; 0: the BCE recipe's RM as it "
                             "is; default: the preset's). Ignored with --rm")
    parser.add_argument("--rm-pair-candidates", type=int, default=None,
                        help="how many pair-stage seeds to train and probe before choosing the blindest (a wider "
                             "search for a blind spot, rarer with cut-off answers in the RM's data; default: the "
                             "preset's)")
    parser.add_argument("--rm-candidate", type=int, default=None,
                        help="start the RM arms from this pair-stage candidate (a seed, 0..rm_pair_candidates-1) "
                             "instead of the blindest one (the lab at a smaller blind spot)")
    parser.add_argument("--rm-choice", choices=("blindest", "between", "median"), default=None,
                        help="which pair-stage candidate the RM arms start from, by its climb on offer: the blindest "
                             "(default), the median, or the one half-way between (does the outcome depend on the "
                             "blind spot's size?)")
    parser.add_argument("--rm-lr", type=float, default=None,
                        help="learning rate of the RM in every arm that trains it (cooper*, offline_pairs, "
                             "cooper_stale, oracle; default: the preset's)")
    parser.add_argument("--actor-lr", type=float, default=None,
                        help="the policy's learning rate, shared by every arm (default: the preset's)")
    parser.add_argument("--rm-answerless-data", action=argparse.BooleanOptionalAction, default=None,
                        help="the starting RM's triples include right completions cut off before their answer, "
                             "labelled 0, as in the paper's sampled RM data, so that text with no answer is no exploit "
                             "(lab/task.py; default: the preset's)")
    parser.add_argument("--require-answer", action="store_true", default=None,
                        help="a format gate on every RM arm: text with no final answer is paid 0 (--cooper.require_answer; "
                             "not the paper's: only blind spots with an answer are left to exploit)")
    parser.add_argument("--preparation-seed", type=int, default=None, metavar="P",
                        help="seed of the lab's preparation (warm start, BCE stage, pair stage; the task is the same): "
                             "independent starting points for one configuration (default 0, the preset's)")
    parser.add_argument("--out", type=Path, default=None, help="lab folder (default: runs/lab-<preset>)")
    parser.add_argument("--publish", type=Path, default=None, metavar="DEST",
                        help="also copy the report and lab.json into DEST to commit (docs/results/<name>): every figure "
                             "as a small PNG, paths under the current folder relative to it")
    parser.add_argument("--parallel-runs", type=int, default=None,
                        help="runs side by side (default: the preset's: 2 for quick, else 1; on a CPU machine one "
                             "run keeps about one core busy)")
    parser.add_argument("--run-timeout", type=float, default=None, help="seconds before one run is killed as failed")
    parser.add_argument("--require-verifier", action="store_true",
                        help="stop before the pair stage and the arms when the BCE-trained starting RM is no verifier "
                             "on its held-out triples (accuracy near the majority-class rate or ROC-AUC below 0.6): "
                             "a pre-registered batch must not spend its runs on a flat RM")
    parser.add_argument("--wandb-project", default=None, metavar="NAME",
                        help="also log every arm to Weights & Biases in this project, with the key from WANDB_API_KEY "
                             "(as wandb reads it: never on a command line or in command.txt)")
    parser.add_argument("--oracle-rollouts", type=Path, nargs="+", default=None, metavar="PATH",
                        help="the oracle arm's pairs harvested from logged rollouts (run or lab folders, rollouts.jsonl "
                             "files, run archives .tar.gz): per problem a right completion against an exploit (wrong, "
                             "stating the reference), graded again by this checkout's verifier; for a policy whose "
                             "answers no style's hedge describes (default: the style's hedge)")
    parser.add_argument("--prepare-only", action="store_true",
                        help="build (or reuse) the task, policy and starting RM, print the starting RM's probe, run no arm")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.wandb_project and not os.environ.get("WANDB_API_KEY"):
        parser.error("--wandb-project: WANDB_API_KEY is not set (export the key there, as wandb reads it)")
    try:
        args.arm_list = parse_arms(args.arms, preset)
    except ValueError as exc:
        parser.error(str(exc))
    for name in ("seeds", "steps", "rm_pair_candidates", "parallel_runs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.preparation_seed is not None and args.preparation_seed < 0:
        parser.error(f"--preparation-seed must be >= 0, got {args.preparation_seed}")
    if args.rm_pair_steps is not None and args.rm_pair_steps < 0:
        parser.error(f"--rm-pair-steps must be >= 0, got {args.rm_pair_steps}")
    for flag, value in (("--rm-lr", args.rm_lr), ("--actor-lr", args.actor_lr)):
        if value is not None and not value > 0:
            parser.error(f"{flag} must be > 0, got {value}")
    task = replace(preset.task, **{k: v for k, v in (("max_operand", args.max_operand), ("heldout", args.heldout))
                                   if v is not None})
    if task != preset.task:
        try:
            task_split(task)
        except ValueError as exc:
            parser.error(f"--max-operand {task.max_operand} --heldout {task.heldout}: {exc}")
    pair_steps = preset.rm_pair_steps if args.rm_pair_steps is None else args.rm_pair_steps
    if args.oracle_rollouts is not None:
        if "oracle" not in args.arm_list:
            parser.error("--oracle-rollouts makes the oracle arm's pairs: name the arm (--arms ...,oracle)")
        missing = [str(p) for p in args.oracle_rollouts if not p.exists()]
        if missing:
            parser.error(f"--oracle-rollouts: no such file or folder: {', '.join(missing)}")
    # the oracle's harvested pairs need no pair source; its hedge needs the style lab's
    needing = [arm for arm in args.arm_list if arm in NEEDS_PAIR_SOURCE
               and not (arm == "oracle" and args.oracle_rollouts is not None)]
    # Pairs of the pair stage's kind come from the lab's own recipe: its pair stage, or the style lab's canonical
    # sentence with no pair stage (lab/arm_pairs.py `has_pair_source`).
    no_source = args.rm is not None or (pair_steps == 0 and preset.style is None)
    if needing and no_source and args.arms is None:
        # the preset's own arms from a given RM: the control has no pair stage to draw from, so it is left out
        args.arm_list = [arm for arm in args.arm_list if arm not in NEEDS_PAIR_SOURCE]
        logger.warning("no pair source (%s): the preset's %s arm is left out; the other arms run",
                       "--rm" if args.rm is not None else "--rm-pair-steps 0", ",".join(needing))
        needing = []
    if needing and no_source:
        parser.error(f"--arms {','.join(needing)} trains the RM on pairs of the pair stage's kind, and this lab has no "
                     f"pair source ({'--rm' if args.rm is not None else '--rm-pair-steps 0'}): run it with the "
                     "preset's pair stage")
    if args.rm_choice is not None and (args.rm_candidate is not None or args.rm is not None or pair_steps == 0):
        parser.error("--rm-choice chooses among the pair stage's candidates; not with --rm-candidate, --rm or "
                     "--rm-pair-steps 0")
    if args.rm is not None and not (args.rm / "config.json").is_file():
        parser.error(f"--rm {args.rm}: not a model folder (no config.json)")
    if args.rm_candidate is not None:
        pair_steps = preset.rm_pair_steps if args.rm_pair_steps is None else args.rm_pair_steps
        if args.rm is not None or pair_steps == 0:
            parser.error("--rm-candidate chooses among the pair stage's candidates; it has none with "
                         + ("--rm" if args.rm is not None else "--rm-pair-steps 0"))
        candidates = args.rm_pair_candidates or preset.rm_pair_candidates
        whose = f"--rm-pair-candidates {candidates}" if args.rm_pair_candidates else f"the {args.preset} preset's {candidates}"
        if not 0 <= args.rm_candidate < candidates:
            parser.error(f"--rm-candidate must be in 0..{candidates - 1} ({whose} pair-stage seeds), got {args.rm_candidate}")
    args.preset_obj = preset.with_overrides(arms=args.arm_list, seeds=args.seeds, steps=args.steps, policy=args.policy,
                                            task=task if task != preset.task else None,
                                            starting_rm=str(args.rm.resolve()) if args.rm else None, rm_lr=args.rm_lr,
                                            actor_lr=args.actor_lr, rm_pair_candidate=args.rm_candidate,
                                            rm_pair_choice=args.rm_choice,
                                            rm_pair_candidates=args.rm_pair_candidates,
                                            require_answer=args.require_answer,
                                            rm_answerless_data=args.rm_answerless_data,
                                            parallel_runs=args.parallel_runs,
                                            preparation_seed=args.preparation_seed,
                                            oracle_rollouts=tuple(str(p.resolve()) for p in args.oracle_rollouts)
                                            if args.oracle_rollouts else None,
                                            # A given RM is used as it is: no stage of the recipe applies to it.
                                            rm_pair_steps=0 if args.rm else args.rm_pair_steps)
    args.out = (args.out or Path("runs") / f"lab-{args.preset}").resolve()
    return args


def _first_to_last(curves: list, label: str, window: int = 1) -> str:
    """'label a -> b': the seed-mean curve's means over its first and last `window` points."""
    from cooper_openrlhf.report.aggregate import band

    curve = band([c for c in curves if c])
    width = min(window, len(curve.mean) // 2) or 1
    if not curve.steps:
        return f"{label} -"
    return f"{label} {sum(curve.mean[:width]) / width:.2f} -> {sum(curve.mean[-width:]) / width:.2f}"


def arm_trends(runs) -> list[str]:
    """One line per arm, its policy's side, means over its seeds: the rule-verified accuracy of its training rollouts
    (first and last VERIFIED_WINDOW steps) and its held-out accuracy (first and last evaluation). What each RM paid
    follows in the last lines (lab/reading.py), where the arms are judged."""
    from cooper_openrlhf.algo.metric_keys import ACCURACY
    from cooper_openrlhf.lab.reading import VERIFIED_WINDOW
    from cooper_openrlhf.report.aggregate import heldout_series

    by_arm: dict[str, list] = {}
    for run in runs:
        if not run.failed:
            by_arm.setdefault(run.arm, []).append(run.scalars)
    width = max(map(len, by_arm), default=0)
    return [f"  {arm:<{width}} "
            f"{_first_to_last([r.get(ACCURACY, []) for r in scalars], 'training accuracy', VERIFIED_WINDOW):<30} "
            f"{_first_to_last([heldout_series(r) for r in scalars], 'held-out accuracy')}   ({len(scalars)} seed(s))"
            for arm, scalars in by_arm.items()]


SETTINGS_FILE = "lab_settings.json"
# Settings added after lab folders were written, with the value that reproduces a folder written before them.
SETTINGS_ADDED = {"rm_pair_steps": 0, "rm_pair_candidate": None, "hacking_rules": "ABCD", "require_answer": False,
                  "rm_answerless_data": False, "rm_pair_choice": "blindest", "rm_balanced_data": False,
                  "rm_eval_rows": None, "style": None, "style_share": 0.0, "preparation_seed": 0,
                  "oracle_rollouts": []}
PAIR_STAGE_FIELDS = ("rm_pair_lr", "rm_pair_candidates", "rm_pair_candidate", "rm_pair_choice")  # meaningless without the stage (rm_pair_steps 0)


def _comparable(settings: dict) -> dict:
    settings = {**SETTINGS_ADDED, **settings}
    settings["hacking_rules"] = named_rules(settings["hacking_rules"])  # folders written with letters ("F") resume
    if settings["rm_pair_steps"] == 0:
        settings = {k: v for k, v in settings.items() if k not in PAIR_STAGE_FIELDS}
    return settings


def check_same_setup(out: Path, preset) -> None:
    """Record the preset's settings in a new lab folder; in an existing one, refuse settings that differ."""
    settings = {k: v for k, v in json.loads(json.dumps(asdict(preset))).items() if k not in RESUMABLE_FIELDS}
    path = out / SETTINGS_FILE
    if not path.is_file():
        path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        return
    before, settings = _comparable(json.loads(path.read_text(encoding="utf-8"))), _comparable(settings)
    changed = sorted(k for k in before.keys() | settings.keys() if before.get(k) != settings.get(k))
    if changed:
        diff = ", ".join(f"{k}: {before.get(k)!r} -> {settings.get(k)!r}" for k in changed)
        raise SystemExit(f"{out} holds a lab run with other settings ({diff}); resuming would mix two configurations "
                         "in one report. Use another --out, or remove the folder.")


def starting_lines(setup: dict) -> list[str]:
    """Where the arms start: the warm-started policy's sampled accuracy, what the starting RM pays for (its probe),
    and how the pair stage chose it."""
    policy = setup.get("policy", {})
    lines = ([f"  starting policy: sampled accuracy {policy['train_accuracy']:.2f} on the train split, "
              f"{policy['heldout_accuracy']:.2f} on the held-out problems (warm start, {policy['steps']} steps)"]
             if "heldout_accuracy" in policy else [])
    if "rm_probe" not in setup:  # a lab of rule arms: no RM
        return [*lines, "  starting RM: none (every arm is paid by the rule verifier)"]
    lines.append(f"  starting RM: {setup['rm_probe']['verdict']}")
    stage = setup["rm"].get("pair_stage")
    if stage:
        climbs = ", ".join(f"{c['climb']:+.3f}" for c in stage["candidates"])
        why = ("as asked (--rm-candidate)" if stage.get("choice") == "given"
               else f"the {stage.get('choice', 'blindest')} by climb on offer to a policy right on "
                    f"{stage['policy_accuracy']:.0%}")
        lines.append(f"  chosen by the pair stage: seed {stage['seed']} of {len(stage['candidates'])}, {why} (climbs at "
                     f"{stage['policy_accuracy']:.0%}: {climbs}); before the stage: {stage['bce_probe']['verdict']}")
    quality = setup["rm"].get("quality")
    if quality:
        lines.append(f"  BCE stage on its held-out triples: accuracy {quality['accuracy']:.3f} (majority-class rate "
                     f"{quality['majority_rate']:.3f}), ROC-AUC {quality['auc'] if quality['auc'] is None else round(quality['auc'], 3)}")
    continuation = setup["rm"].get("offline_continuation")
    if continuation:
        lines.append(f"  offline continuation ({continuation['steps']} more pair-stage steps, no policy): "
                     f"{continuation['probe']['verdict']} ({continuation['command']})")
    return lines


def write_record(path: Path, record: dict, ran: int) -> bool:
    """Write the lab's record (lab.json) unless this invocation ran no run and a record exists: a re-report of
    finished runs (e.g. `--seeds 3` over a batch's 8) must not replace the record of the invocation that ran them
    (its command, wall time, commit). Returns whether it wrote."""
    if ran == 0 and path.is_file():
        logger.info("no run ran: %s kept as the record of the invocation that ran them (the report is rewritten)", path)
        return False
    path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from cooper_openrlhf import __version__
    from cooper_openrlhf.lab.batch import check_folder_commit, package_checkout, package_commit
    from cooper_openrlhf.lab.prepare import NoVerifierError, prepare
    from cooper_openrlhf.lab.prepared import copy_prepared
    from cooper_openrlhf.lab.progress import RunsProgress, polling
    from cooper_openrlhf.lab.reading import read_runs
    from cooper_openrlhf.lab.runner import read_info, run_arms, stop_runs_on_sigterm, with_earlier_runs
    from cooper_openrlhf.report.build import write_report

    preset, out = args.preset_obj, args.out
    checkout = package_checkout()  # None for an installed package: no plans to check, no committed results to state
    # A folder of a pre-registered batch runs only from the plan's commit, by hand as by `cli.batch` (nothing is
    # touched, no signal handler installed, before the check).
    check_folder_commit(checkout, out)
    stop_runs_on_sigterm()
    out.mkdir(parents=True, exist_ok=True)
    check_same_setup(out, preset)
    started = time.perf_counter()
    prepared_at_install = copy_prepared(preset, out)  # the demo's, made by scripts/install.sh (lab/prepared.py)
    try:
        with logging_redirect_tqdm():  # the preparation's progress lines stay whole between its log lines
            files, setup = prepare(preset, out, require_verifier=args.require_verifier)
    except NoVerifierError as exc:
        print(f"lab {preset.name}: {exc}", file=sys.stderr)
        return 3
    if prepared_at_install:
        setup["prepared_at_install"] = str(prepared_at_install)
    if args.prepare_only:  # lab.json is the record of runs: a preparation alone leaves it as it was
        print("\n".join([f"lab {preset.name}: prepared {out}", *starting_lines(setup)]))
        return 0
    plan = [(arm, seed) for seed in range(preset.seeds) for arm in preset.arms]  # seed-major: arms finish together
    done_before = {key for key in plan if read_info(files.run_dir(*key)).get("status") == "done"}
    # One line per run (step, last reward, elapsed and remaining), read from the runs' own logs (lab/progress.py).
    progress = RunsProgress(plan, files.run_dir, preset.steps, done_before)
    try:
        with logging_redirect_tqdm(), polling(progress.update):
            results = run_arms(preset, files, plan, timeout_s=args.run_timeout, parallel=preset.parallel_runs,
                               on_done=progress.finished, extra_flags=wandb_flags(args.wandb_project))
    finally:
        progress.close()
    # The report and lab.json hold every finished run of the folder, earlier invocations' too, so a lab grown by
    # more seeds or arms is reported whole (check_same_setup keeps a folder to one configuration).
    reported = with_earlier_runs(files, plan, ARMS)
    report_dir = out / "report"
    runs = write_report([str(files.run_dir(arm, seed)) for arm, seed in reported], report_dir, known_arms=ARMS,
                        style=preset.style)
    wall = time.perf_counter() - started
    all_runs = results + [read_info(files.run_dir(arm, seed)) for arm, seed in reported[len(plan):]]
    record = {"preset": preset.name, "version": __version__,
              "commit": package_commit(checkout) if checkout else None,
              "command": " ".join(["python -m cooper_openrlhf.cli.lab", *(argv if argv is not None else sys.argv[1:])]),
              # this invocation's wall time, and every reported run's own time (a lab resumed over days is not one wall)
              "wall_seconds": round(wall, 1), "run_seconds": round(sum(r.get("seconds") or 0 for r in all_runs), 1),
              "setup": setup, "runs": all_runs, "preset_settings": asdict(preset)}
    write_record(out / "lab.json", record, ran=sum((r["arm"], r["seed"]) not in done_before for r in results))
    if args.publish:
        from cooper_openrlhf.report.publish import publish_report

        publish_report(report_dir, args.publish, root=Path.cwd(), extra=[out / "lab.json"])
        print(f"published: {args.publish}")
    if wall > 60 * preset.budget_minutes:
        logger.warning("lab %s took %.0f min, over the %d min it is sized for on a 2-core machine (docs/lab.md)",
                       preset.name, wall / 60, preset.budget_minutes)
    failed = [r for r in results if r["status"] != "done"]
    print(f"\nlab {preset.name}: {len(results) - len(failed)}/{len(results)} runs done in {wall / 60:.1f} min "
          f"(this invocation); report {report_dir / 'report.md'}; figure {report_dir / 'rewards_accuracy.png'}")
    print("\n".join(arm_trends(runs)))
    print("\n".join(starting_lines(setup)))
    print("\n".join(read_runs(runs, checkout)))
    for r in failed:
        print(f"  FAILED {r['arm']} seed {r['seed']}: exit {r.get('exit')}; log {r['log']}")
    return 1 if failed else 0


def wandb_flags(project: str | None) -> tuple[str, ...]:
    """train_cooper's wandb flags for `--wandb-project`: the key stays in WANDB_API_KEY (train_cooper reads it)."""
    return ("--logger.wandb.key", WANDB_KEY_FROM_ENV, "--logger.wandb.project", project) if project else ()


if __name__ == "__main__":
    sys.exit(main())
