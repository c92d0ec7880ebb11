"""Power of the plans' paired test (exact two-sided sign-flip p < 0.05, the difference's sign as registered) by
simulation: normal seed differences of mean delta and sd, for each number of seeds. What a plan's seed count rests on.

    python scripts/sign_flip_power.py            # sd 0.03, 0.05, 0.07; 8, 10, 12 seeds; delta 0.04-0.10
    python scripts/sign_flip_power.py --sd 0.24 --seeds 12 --delta 0.10     # one case

(The bootstrap CI of the decision rule is left out: at these sizes p < 0.05 is the binding condition.)
"""

import itertools

import numpy as np

rng = np.random.default_rng(0)
def power(n, delta, sd, reps=2000):
    signs = np.array(list(itertools.product((1, -1), repeat=n)))  # (2^n, n)
    hits = 0
    for _ in range(reps):
        d = rng.normal(delta, sd, n)
        obs = abs(d.mean())
        p = (np.abs(signs @ d / n) >= obs - 1e-12).mean()
        hits += p < 0.05 and d.mean() > 0
    return hits / reps

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="power of the paired sign-flip test by simulation")
    parser.add_argument("--sd", type=float, help="sd of the seed differences (with --seeds and --delta: one case)")
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--delta", type=float)
    args = parser.parse_args()
    if args.sd is not None:
        print(f"sd {args.sd}, {args.seeds} seeds, delta {args.delta}: power {power(args.seeds, args.delta, args.sd):.2f}")
    else:
        for sd in (0.03, 0.05, 0.07):
            print(f"sd {sd}: power at delta 0.04, 0.06, 0.08, 0.10 by seeds", {n: [float(round(power(n, dl, sd, 1000), 2)) for dl in (0.04, 0.06, 0.08, 0.10)] for n in (8, 10, 12)})
