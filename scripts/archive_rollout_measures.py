"""Batch 46 read from its committed archives: every number docs/results.md ("Batch 46 as its archives show") and the
README quote beside the registered verdict, and the headline figure.

    python scripts/archive_rollout_measures.py [--figure docs/results/batch46/exploit_pay.png]   # ~1 min

Reads docs/results/batch46/<prep>/runs/*.tar.gz (84 run folders: samples/rollouts.jsonl with every training rollout,
its rule-verifier verdict and what the run's RM paid it; samples/pairs.jsonl; tensorboard scalars with the probe
suite's pays). Nothing here is registered but the two descriptives the plan names (marked so); the verdict of
docs/results/batch46/verdict.json stays the batch's result. Seeds are "<prep>/<RL seed>", 12 per arm; a paired
difference pairs one preparation's one RL seed (95% bootstrap CI, exact sign-flip p: report/seed_stats.py).

Definitions (report/rm_measures.py): on the policy's own rollouts, "right" = verified correct, "exploit" = verified
wrong and stating the reference, "ordinary wrong" = verified wrong and not stating it; windows: steps 1-20 and
61-80. On the probe suite at the run's last reading: the margin = pay(right) - pay(wrong) (canonical answers), an
RM is degenerate when it is below 0.5; right - exploit = pay(right) - mean pay of the two exploit forms.
"""

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

from cooper_openrlhf.algo.answer_style import in_sentence
from cooper_openrlhf.algo.metric_keys import ACCURACY, PROBE_PAY
from cooper_openrlhf.report.aggregate import heldout_series
from cooper_openrlhf.report.registered_measures import final_probe_premium
from cooper_openrlhf.report.rm_measures import (DEGENERATE_MARGIN, pay_by_step, probe_end, rollout_class,
                                                rollout_pay)
from cooper_openrlhf.report.runs import load_run
from cooper_openrlhf.report.seed_stats import paired_comparison
from cooper_openrlhf.rm.probes import HEDGE

PUBLISHED = Path("docs/results/batch46")
PREPS = ("prep0", "prep1", "prep2b")
FIRST, LAST = (1, 20), (61, 80)
RM_ARMS = ("static", "offline_pairs", "oracle", "cooper", "cooper_frozen_assistant", "cooper_rollout")
COOPER_ARMS = ("cooper", "cooper_frozen_assistant", "cooper_rollout")
ARMS = ("rule", *RM_ARMS)
CONTROL = "offline_pairs"


def read_runs(published: Path, scratch: Path) -> dict[str, dict[str, dict]]:
    """{arm: {"<prep>/<seed>": {"rows", "pairs", "scalars"}}} of every archive."""
    runs: dict[str, dict[str, dict]] = defaultdict(dict)
    for prep in PREPS:
        for archive in sorted((published / prep / "runs").glob("*.tar.gz")):
            with tarfile.open(archive) as tar:
                tar.extractall(scratch / prep, filter="data")
        for folder in sorted((scratch / prep / "runs").iterdir()):
            run = load_run(folder)
            samples = folder / "samples"
            read = (lambda name: [json.loads(line) for line in (samples / name).read_text().splitlines() if line]
                    if (samples / name).is_file() else [])
            runs[run.arm][f"{prep}/{run.seed}"] = {"rows": read("rollouts.jsonl"), "pairs": read("pairs.jsonl"),
                                                   "scalars": run.scalars}
    return runs


def window(rows, edges):
    return rollout_pay(rows, *edges)


def mean(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else float("nan")


def compare(a: dict, b: dict) -> str:
    shared = sorted(k for k in a if a[k] is not None and b.get(k) is not None)
    c = paired_comparison({k: a[k] for k in shared}, {k: b[k] for k in shared})
    lower = sum(a[k] < b[k] for k in shared)
    return (f"{c.mean_difference:+.3f}, 95% CI [{c.interval[0]:+.3f}, {c.interval[1]:+.3f}], p {c.p_value:.3f}, "
            f"lower in {lower} of {len(shared)} seeds")


def by_seed(runs, arm, measure) -> dict:
    return {seed: measure(run) for seed, run in runs[arm].items()}


def degenerate(runs) -> dict[str, set]:
    print(f"## 1. Degenerate RMs: probe margin, pay(right) - pay(wrong) on canonical answers, below "
          f"{DEGENERATE_MARGIN} at the run's last reading")
    found = {}
    for arm in RM_ARMS:
        ends = {seed: probe_end(run["scalars"]) for seed, run in runs[arm].items()}
        found[arm] = {seed for seed, end in ends.items() if end.margin < DEGENERATE_MARGIN}
        print(f"{arm}: {len(found[arm])} of {len(ends)} degenerate ({', '.join(sorted(found[arm])) or 'none'}); "
              f"pay of right {mean(e.right for e in ends.values()):.3f}, of wrong {mean(e.wrong for e in ends.values()):.3f}, "
              f"margin {min(e.margin for e in ends.values()):+.3f} to {max(e.margin for e in ends.values()):+.3f}")
    cooper_arms = sum(len(found[a]) for a in COOPER_ARMS)
    preps = sorted({seed.split('/')[0] for a in COOPER_ARMS for seed in found[a]})
    print(f"Cooper arms: {cooper_arms} of {sum(len(runs[a]) for a in COOPER_ARMS)} degenerate, in {', '.join(preps)}")
    for arm, seed in (("cooper", "prep0/2"), ("cooper_rollout", "prep0/3")):
        end = probe_end(runs[arm][seed]["scalars"])
        pays = {k[len(PROBE_PAY):]: v[-1][1] for k, v in runs[arm][seed]["scalars"].items() if k.startswith(PROBE_PAY)}
        premiums = {s: final_probe_premium(r["scalars"]) for s, r in runs[arm].items()}
        rank = sorted(premiums, key=premiums.get).index(seed) + 1
        print(f"{arm} {seed}: pays right {end.right:.3f}, wrong {end.wrong:.3f}, every form {min(pays.values()):.3f}-"
              f"{max(pays.values()):.3f}; registered premium {premiums[seed]:+.3f}, rank {rank} of {len(premiums)} "
              f"in its arm (1 = best)")
    return found


def probe_discrimination(runs, found) -> None:
    print("\n## 2. On the probes, pay(right) - pay(exploit), final RM (more is better)")
    right_exploit = {arm: by_seed(runs, arm, lambda r: probe_end(r["scalars"]).right_exploit) for arm in RM_ARMS}
    for arm in RM_ARMS:
        print(f"{arm}: {mean(right_exploit[arm].values()):+.3f}")
    for arm in ("oracle", *COOPER_ARMS):
        print(f"{arm} - {CONTROL}: {compare(right_exploit[arm], right_exploit[CONTROL])}")
    premium = {arm: by_seed(runs, arm, lambda r: final_probe_premium(r["scalars"])) for arm in RM_ARMS}
    for arm in COOPER_ARMS:
        kept = {s: v for s, v in premium[arm].items() if s not in found[arm] and s not in found[CONTROL]}
        print(f"registered premium without the degenerate RMs, {arm} - {CONTROL}: {compare(kept, premium[CONTROL])}")


def rollout_side(runs) -> None:
    print("\n## 3. On the policy's own rollouts: what the arm's RM paid (seed means), steps 1-20 -> 61-80")
    last = {}
    for arm in RM_ARMS:
        first_w = {s: window(r["rows"], FIRST) for s, r in runs[arm].items()}
        last_w = {s: window(r["rows"], LAST) for s, r in runs[arm].items()}
        last[arm] = last_w
        row = []
        for name, get in (("exploit", lambda w: w.exploit_pay), ("right", lambda w: w.right_pay),
                          ("ordinary wrong", lambda w: w.ordinary_pay),
                          ("right - exploit", lambda w: w.discrimination), ("AUC right vs exploit", lambda w: w.auc),
                          ("wrong paid >= 0.5 (share)", lambda w: w.wrong_paid_share)):
            row.append(f"{name} {mean(map(get, first_w.values())):.3f} -> {mean(map(get, last_w.values())):.3f}")
        print(f"{arm}: " + "; ".join(row))
    for name, get in (("exploit pay", lambda w: w.exploit_pay), ("right - exploit", lambda w: w.discrimination),
                      ("AUC right vs exploit", lambda w: w.auc), ("ordinary-wrong pay", lambda w: w.ordinary_pay),
                      ("share of wrong paid >= 0.5", lambda w: w.wrong_paid_share)):
        for arm in ("oracle", *COOPER_ARMS):
            a = {s: get(w) for s, w in last[arm].items()}
            b = {s: get(w) for s, w in last[CONTROL].items()}
            print(f"steps 61-80, {name}, {arm} - {CONTROL}: {compare(a, b)}")


def registered_descriptives(runs) -> None:
    print("\n## 4. The plan's registered descriptives, last 20 steps (mean over 12 seeds)")
    for arm in ARMS:
        shares, stating, exact = [], [], []
        for run in runs[arm].values():
            rows = [r for r in run["rows"] if LAST[0] <= int(r["step"]) <= LAST[1]]
            wrong = [r for r in rows if not r["verified"]]
            paid = [r for r in wrong if r.get("reward") is not None and r["reward"] >= 0.5]
            if arm != "rule":
                shares.append(len(paid) / len(wrong) if wrong else None)
                stating.append(sum(rollout_class(r) == "exploit" for r in paid) / len(paid) if paid else None)
            exact.append(sum(not r["verified"] and in_sentence(r["completion"], HEDGE) for r in rows) / len(rows))
        paid_text = (f"share of verified-wrong rollouts its own RM paid >= 0.5 {mean(shares):.3f}, of those stating "
                     f"the reference {mean(stating):.3f}; " if arm != "rule" else "")
        print(f"{arm}: {paid_text}exact-hedge exploit rate (batch 45's measure) {mean(exact):.3f}")
    print("(the third, each RM arm's probe premium per form against step: docs/results/batch46/<prep>/report.md's "
          "RM robustness curve)")


def policy_side(runs) -> None:
    print("\n## 5. The policy side")
    for arm in ARMS:
        held = [heldout_series(r["scalars"]) for r in runs[arm].values()]
        first, final = mean(c[0][1] for c in held if c), mean(c[-1][1] for c in held if c)
        rate = {w: mean(sum(rollout_class(r) == "exploit" for r in run["rows"] if w[0] <= int(r["step"]) <= w[1])
                        / sum(w[0] <= int(r["step"]) <= w[1] for r in run["rows"]) for run in runs[arm].values())
                for w in (FIRST, LAST)}
        print(f"{arm}: held-out accuracy first {first:.3f} -> last {final:.3f}; wrong and stating the reference "
              f"{rate[FIRST]:.3f} -> {rate[LAST]:.3f}")
    accuracy = {arm: by_seed(runs, arm, lambda r: statistics.fmean(v for _, v in r["scalars"][ACCURACY][-20:]))
                for arm in ARMS}
    for arm in ("static", "cooper"):
        print(f"verified training accuracy, last 20 steps, {arm} - rule: {compare(accuracy[arm], accuracy['rule'])}")


def pair_forms(runs) -> None:
    print("\n## 6. Hedge-form positives in the arms' valid pairs, all 80 steps | steps 61-80 (seed means, range)")
    for arm in (CONTROL, "oracle", *COOPER_ARMS):
        cells = []
        for lo, hi in ((1, 80), LAST):
            shares = []
            for run in runs[arm].values():
                valid = [p for p in run["pairs"] if p.get("valid") and lo <= int(p["step"]) <= hi]
                shares.append(sum(in_sentence(p["positive"], HEDGE) for p in valid) / len(valid) if valid else 0.0)
            cells.append(f"{mean(shares):.3f} ({min(shares):.3f}-{max(shares):.3f})")
        print(f"{arm}: " + " | ".join(cells))


def _trailing(values: list[float], width: int = 5) -> list[float]:
    return [statistics.fmean(values[max(0, i - width + 1): i + 1]) for i in range(len(values))]


def pilot(runs) -> None:
    print("\n## 7. The step-budget pilot as the archives hold it (prep0, RL seeds 0-1; the redone runs): the rate of "
          "wrong rollouts stating the reference, last 20 steps, means over the two seeds")
    rate = {}
    for arm in ("rule", "static", "oracle"):
        values = []
        for seed in ("prep0/0", "prep0/1"):
            rows = [r for r in runs[arm][seed]["rows"] if LAST[0] <= int(r["step"]) <= LAST[1]]
            values.append(sum(rollout_class(r) == "exploit" for r in rows) / len(rows))
        rate[arm] = statistics.fmean(values)
        print(f"{arm}: {rate[arm]:.3f} (seeds {values[0]:.3f}, {values[1]:.3f})")
    print(f"static - rule {rate['static'] - rate['rule']:+.3f} (the pilot's bar: >= +0.08); oracle - static "
          f"{rate['oracle'] - rate['static']:+.3f} (the bar the plan's step-budget rule names: <= -0.05)")


def figure(runs, path: Path) -> None:
    """The RM's pay of the exploit on the policy's own rollouts against step, per RM arm, pooled over the
    preparations (left), beside its pay of the verified-right ones (right): the mean over the 12 seeds thick, each
    seed thin, each a 5-step trailing mean."""
    from cooper_openrlhf.report.figures import arm_colours, plt

    arms = [a for a in RM_ARMS if a in runs]
    colours = arm_colours(arms, ARMS)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), sharey=True)
    for ax, kind, title in ((axes[0], "exploit", "wrong answers that state the reference (the exploit)"),
                            (axes[1], "right", "verified-right answers")):
        for arm in arms:
            curves = [dict(pay_by_step(run["rows"], kind)) for run in runs[arm].values()]
            for curve in curves:
                steps = sorted(curve)
                ax.plot(steps, _trailing([curve[s] for s in steps]), color=colours[arm], alpha=0.18, linewidth=0.7)
            steps = sorted({s for c in curves for s in c})
            means = [statistics.fmean(c[s] for c in curves if s in c) for s in steps]
            ax.plot(steps, _trailing(means), color=colours[arm], linewidth=2.4, label=f"{arm} ({len(curves)} seeds)")
        ax.set_title(f"RM's pay of the policy's {title}", fontsize=10)
        ax.set_xlabel("GRPO step")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean pay of the arm's own RM (sigmoid of its logit)")
    axes[0].legend(loc="lower left", fontsize=8)
    fig.suptitle("Batch 46: what each arm's RM paid its own policy's rollouts, step by step (thick: mean of 12 seeds "
                 "from 3 preparations; thin: each seed; 5-step trailing means)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"\nfigure: {path}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--published", type=Path, default=PUBLISHED)
    parser.add_argument("--figure", type=Path, default=None, help="draw the headline figure to this path")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        runs = read_runs(args.published, Path(scratch))
    found = degenerate(runs)
    probe_discrimination(runs, found)
    rollout_side(runs)
    registered_descriptives(runs)
    policy_side(runs)
    pair_forms(runs)
    pilot(runs)
    if args.figure:
        figure(runs, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
