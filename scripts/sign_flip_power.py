"""Power of the plans' paired test (exact two-sided sign-flip p < 0.05, the difference's sign as registered) by
simulation: normal seed differences of mean delta and sd, for each number of seeds. What a plan's seed count rests on.

    python scripts/sign_flip_power.py            # sd 0.03, 0.05, 0.07; 8, 10, 12 seeds; delta 0.04-0.10

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

for sd in (0.03, 0.05, 0.07):
    print(f"sd {sd}: power at delta 0.04, 0.06, 0.08, 0.10 by seeds", {n: [float(round(power(n, dl, sd, 1000), 2)) for dl in (0.04, 0.06, 0.08, 0.10)] for n in (8, 10, 12)})
