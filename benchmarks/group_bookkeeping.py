"""Per-sample cost of the reward service's group bookkeeping (serve/groups.py): reserve + record, and, where the
tracker has them, the silence check and the retry lookup (a fingerprint of the sample), for a rollout batch of
1,024 prompts x 8 samples of ~1.6 KB.

    python benchmarks/group_bookkeeping.py CHECKOUT   # the tracker of the package at CHECKOUT (a worktree)

Run it on two checkouts (e.g. `git worktree add /tmp/before 74d04c7`) to compare; the cost is against a
request's, which is milliseconds (docs/serve.md, "Numbers").
"""
import sys
import time

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
from cooper_openrlhf.serve.groups import GroupTracker, ScoredSample
from cooper_openrlhf.serve.protocol import Sample
from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome
new = hasattr(GroupTracker, "answered")
if new:
    from cooper_openrlhf.serve.groups import fingerprint
P, N, text = 1024, 8, "Let me think step by step. " * 60  # ~1.6 KB completions
samples = [Sample(f"prompt {p} " * 20, f"q{p}", str(p), text + str(k)) for p in range(P) for k in range(N)]
outcome = VerifyOutcome(Verdict.CORRECT, "1", 0.0)
best = float("inf")
for _ in range(5):
    g = GroupTracker(N)
    start = time.perf_counter()
    for s in samples:
        if new:
            g.arrived(); g.answered(fingerprint(s))
            group = g.reserve(s.prompt, 0, s.reference)
        else:
            group = g.reserve(s.prompt, 0)
        g.record(group, ScoredSample(s, 0.1, outcome, 0.5))
    best = min(best, (time.perf_counter() - start) / len(samples))
print(f"{'after' if new else 'before'}: {best * 1e6:.1f} us per sample ({len(samples)} samples, best of 5)")
