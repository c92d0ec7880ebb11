"""Batch 46's seed count: power of its paired test on its two primary measures, simulated from batch 45's archives.

    python scripts/seed_count_power.py [docs/results/batch45/main/runs]      # ~1 min

What it reads (every number from the published archives, as scripts/exploit_detector_reread.py reads them):
- the policy measure: per run, the share of the last 20 steps' rollouts that are verified wrong and state the
  reference (`algo/answer_style.is_exploit`), cooper - offline_pairs paired by seed;
- the RM measure: batch 45 saved no RM and read no probe suite, so its stand-in is what each run's own RM paid its
  policy's exploit rollouts on steps 61-80 above what it paid its other verified-wrong rollouts (the premium of
  scripts/exploit_detector_reread.py), cooper - offline_pairs paired by seed. The probe suite's premium reads fixed probes
  of held-out problems rather than whatever the policy wrote, so its spread may differ: the pilot's static runs
  and the batch's own runs say by how much.

How the power is simulated (the plan's test: the exact two-sided sign-flip p of the paired mean, the sign as
registered; the bootstrap interval is left out, at these sizes p is the binding condition):
- each Cooper arm is judged against offline_pairs with Holm over the three Cooper arms, so the power quoted is a
  lower bound for one arm, at Holm's strictest level 0.05 / 3 (an arm whose p clears it is declared whatever the
  others do);
- differences drawn two ways: normal with the observed paired sd, and the observed differences centred and
  resampled (their own shape, heavy tails included), each shifted to the registered effect;
- batch 45 had one preparation, so its paired sd holds no preparation-by-arm interaction; batch 46 blocks its
  seeds by three preparations, and its sd is taken as the observed one times 1.0 and 1.5.
"""

import itertools
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exploit_detector_reread import ARCHIVES, exploit, in_window, mean, read_runs  # noqa: E402

LAST = (61, 80)
ALPHA, COOPER_ARMS = 0.05, 3
SD_INFLATION = (1.0, 1.5)
SEEDS = (6, 9, 12, 15)
REPS = 2000


def policy_rate(run: dict) -> float:
    rows = in_window(run["rows"], LAST)
    return sum(map(exploit, rows)) / len(rows)


def rm_premium(run: dict) -> float | None:
    rows = in_window(run["rows"], LAST)
    paid = mean(r["reward"] for r in rows if exploit(r))
    other = mean(r["reward"] for r in rows if not r["verified"] and not exploit(r))
    return None if paid is None or other is None else paid - other


def paired(runs: dict, measure, a: str = "cooper", b: str = "offline_pairs") -> np.ndarray:
    values = {arm: {s: measure(run) for s, run in runs[arm].items()} for arm in (a, b)}
    seeds = [s for s in sorted(values[a]) if values[a][s] is not None and values[b].get(s) is not None]
    return np.array([values[a][s] - values[b][s] for s in seeds])


def sign_flip_power(draw, n: int, delta: float, alpha: float, rng, reps: int = REPS) -> float:
    """Share of `reps` simulated batches of n paired differences (`draw(n) + delta`) whose exact two-sided sign-flip
    p is below `alpha` with the mean on the registered side (the sign of delta)."""
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))  # (2^n, n)
    hits = 0
    for _ in range(reps):
        d = draw(n) + delta
        observed = abs(d.mean())
        p = (np.abs(signs @ d / n) >= observed - 1e-12).mean()
        hits += p < alpha and np.sign(d.mean()) == np.sign(delta)
    return hits / reps


def table(name: str, differences: np.ndarray, deltas: tuple[float, ...], rng) -> None:
    sd = float(np.std(differences, ddof=1))
    centred = differences - differences.mean()
    print(f"\n## {name}: batch 45 cooper - offline_pairs {differences.mean():+.3f}, paired sd {sd:.3f} "
          f"(n={len(differences)}); power at Holm's strictest level {ALPHA / COOPER_ARMS:.4f}")
    for inflation in SD_INFLATION:
        for how, draw in (("normal", lambda n, k=inflation: rng.normal(0.0, sd * k, n)),
                          ("resampled", lambda n, k=inflation: rng.choice(centred, n) * k)):
            cells = []
            for delta in deltas:
                row = [sign_flip_power(draw, n, delta, ALPHA / COOPER_ARMS, rng) for n in SEEDS]
                cells.append(f"delta {delta:+.2f}: " + ", ".join(f"{n} seeds {p:.2f}" for n, p in zip(SEEDS, row)))
            print(f"sd x{inflation} ({how}): " + " | ".join(cells))


def main(folder: Path) -> None:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as scratch:
        runs = read_runs(folder, Path(scratch))
    rate = paired(runs, policy_rate)
    premium = paired(runs, rm_premium)
    for arm in ("rule", "static", "offline_pairs", "cooper"):
        rates = [policy_rate(r) for r in runs[arm].values()]
        print(f"{arm}: wrong and states the reference, steps 61-80, {statistics.fmean(rates):.3f} ± "
              f"{statistics.stdev(rates):.3f}")
    gate = paired(runs, policy_rate, "static", "rule")
    print(f"static - rule on that rate: {gate.mean():+.3f}, paired sd {np.std(gate, ddof=1):.3f}")
    table("RM: premium of the policy's exploits (the probe premium's stand-in)", premium, (-0.20, -0.25, -0.30), rng)
    table("policy: wrong and states the reference, last 20 steps", rate, (-0.02, -0.03, -0.04), rng)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ARCHIVES)
