"""Per-sample cost of the reward service's group bookkeeping (serve/groups.py): reserve + record, and, where the
tracker has them, the silence check and the retry lookup (a fingerprint of the sample), for a rollout batch of
1,024 prompts x 8 samples of ~1.6 KB; and the memory the tracker still holds per sample once every group completed
(the record of answers kept for retries: what a service without --learn keeps).

    python benchmarks/group_bookkeeping.py CHECKOUT   # the tracker of the package at CHECKOUT (a worktree)

Run it on two checkouts (e.g. `git worktree add /tmp/before 74d04c7`) to compare; the cost is against a
request's, which is milliseconds (docs/serve.md, "Numbers").
"""
import gc
import sys
import time
import tracemalloc

checkout = sys.argv[1] if len(sys.argv) > 1 else "."
sys.path.insert(0, checkout)
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
print(f"{checkout}: {best * 1e6:.1f} us per sample ({len(samples)} samples, best of 5)")

# Memory: each sample's texts made afresh, as a request's are parsed, so what the tracker keeps is what it holds.
g = GroupTracker(N)
tracemalloc.start()
held_before = tracemalloc.get_traced_memory()[0]
for s in samples:
    s = Sample(*((text + "#")[:-1] for text in (s.prompt, s.question, s.reference, s.completion)))  # new strings
    if new:
        g.arrived(); g.answered(fingerprint(s))
    group = g.reserve(s.prompt, 0, s.reference) if new else g.reserve(s.prompt, 0)
    g.record(group, ScoredSample(s, 0.1, outcome, 0.5))
del s, group
gc.collect()
held = tracemalloc.get_traced_memory()[0] - held_before
tracemalloc.stop()
print(f"{checkout}: {held / len(samples) / 1024:.2f} KiB held per sample once its group completed "
      f"({held / 2**20:.1f} MiB for {len(samples)} samples; open groups {len(g.open)})")
