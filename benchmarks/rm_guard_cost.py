"""What the RM guard costs a Cooper step: its seconds against the step's, in one run with the guard on.

Launches `python -m cooper_openrlhf.cli.train_cooper --remote_rm_trainable` (benchmarks/cooper_step_time.py's
configuration: SmolLM2-135M-Instruct sampled at 0.7, 4 prompts x 8 rollouts, rollout negatives) with the guard on
(--cooper.rm_guard rollback) and reads back, per step, what the guard took: `cooper/rm_health/seconds` (every RM
rank's finiteness check, the anchors scored through the RM group, the decision and any rollback, plus the baseline
read at the first update) and `cooper/rm_health/snapshot_seconds` (every rank's copy of its training state), against
OpenRLHF's `timing/step_total`. Step 1 is warm-up and left out; the numbers are medians over the other steps. The
guard runs inside the RM update, which a run with the RM on its own devices overlaps with the policy update, so
the ratio printed is the most it can add to a step's wall time.

The RM: --rm (default: the lab's prepared VerifyRM, whose eval_split.jsonl gives the anchors as in a lab run, else
the tiny RM with 64 labelled rows written here); the probe suite joins the anchors from the prompts file, given as
--eval.dataset (no held-out evaluation runs: --eval.steps stays off).

    python benchmarks/rm_guard_cost.py [--steps 5] [--rm PATH] [--anchor-probe-problems 4] [--work DIR] [-- FLAGS...]
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cooper_step_time import labelled_rows, run_arm, train_cooper_argv, write_prompts  # noqa: E402

GUARD = ("cooper/rm_health/seconds", "cooper/rm_health/snapshot_seconds")
TOTAL = "timing/step_total"


def lab_rm() -> str | None:
    """The lab's prepared starting VerifyRM, when the install made one (lab/prepared.py)."""
    from cooper_openrlhf.models.paths import models_dir

    for folder in sorted((models_dir() / "prepared").glob("*/verifyrm")):
        chosen = folder / "pairs" / "chosen.json"
        if chosen.is_file():
            return str(folder / "pairs" / f"seed{json.loads(chosen.read_text())['seed']}")
        if (folder / "best" / "config.json").is_file():
            return str(folder / "best")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="steps (the first is warm-up)")
    parser.add_argument("--rm", default=None, help="reward-model path (default: the lab's prepared VerifyRM)")
    parser.add_argument("--policy", default=None, help="policy path (default: smollm2-135m-instruct)")
    parser.add_argument("--anchor-probe-problems", type=int, default=4)
    parser.add_argument("--work", default=None, help="folder for logs and outputs (default: a new temporary one)")
    parser.add_argument("extra", nargs="*", help="extra train_cooper flags (after --)")
    args = parser.parse_args()
    from cooper_openrlhf.models import model_path

    work = Path(args.work or tempfile.mkdtemp(prefix="rm_guard_cost_"))
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "prompts.jsonl"
    write_prompts(prompts, 4 * args.steps)
    flags = []
    rm = args.rm or lab_rm()
    if rm is None:
        rm = str(model_path("tiny-qwen2-rm"))
        labelled_rows(work / "anchors.jsonl")
        flags += ["--cooper.rm_anchors", str(work / "anchors.jsonl")]
    # cooper_step_time's configuration, as its argparse defaults give it
    step_args = argparse.Namespace(policy=args.policy or str(model_path("smollm2-135m-instruct")), rm=rm,
                                   max_new_tokens=96, n_samples=8, temperature=0.7, dtype="auto", policy_lr=0.0,
                                   extra=[])
    argv = [*train_cooper_argv(step_args, prompts, work / "guarded"), "--remote_rm_trainable",
            "--cooper.negative_source", "rollout", "--cooper.rm_guard", "rollback", "--eval.dataset", str(prompts),
            "--cooper.rm_anchor_probe_problems", str(args.anchor_probe_problems), *flags, *args.extra]
    report(run_arm("guarded", argv, work / "guarded"), rm, work)


def report(scalars: dict, rm: str, work: Path) -> None:
    """Print the guard's seconds against the step's (steps after the first; a step without an RM update has no
    guard time: it is counted as 0 there, and the steps that had one are counted)."""
    steps = sorted(scalars.get(TOTAL, {}))[1:]
    if not steps or not any(key in scalars for key in GUARD):
        sys.exit(f"no guard timing logged (is the guard on, with anchors?): see {work / 'guarded'}")
    parts = {key: [scalars.get(key, {}).get(step, 0.0) for step in steps] for key in GUARD}
    guard = [sum(values) for values in zip(*parts.values())]
    total = [scalars[TOTAL][step] for step in steps]
    ratios = [g / t for g, t in zip(guard, total)]
    checked = sum(step in scalars.get(GUARD[0], {}) for step in steps)
    print(f"RM {rm}; {len(steps)} steps after warm-up, {checked} with an RM update the guard checked (work: {work})")
    print(f"guard seconds per step (median): {statistics.median(guard):.3f} (anchors, finiteness and decision "
          f"{statistics.median(parts[GUARD[0]]):.3f}, snapshot {statistics.median(parts[GUARD[1]]):.3f}); "
          f"max {max(guard):.3f}")
    print(f"step seconds (median timing/step_total): {statistics.median(total):.2f}")
    print(f"guard / step: {statistics.median(ratios):.3f} (median), {max(ratios):.3f} (max); target <= 0.05")

if __name__ == "__main__":
    main()
