"""The choices of the pair pipeline, in one registry each (`runtime.registry.Registry`).

They live here rather than in `algo.selection`, so `algo.negatives` (whose `NegativeConfig` checks its validity
rule) and `algo.selection` (which acts on all three) both read them without importing each other.
"""

from cooper_openrlhf.runtime.registry import Registry

__all__ = ["NEGATIVE_SOURCES", "NEGATIVE_VALIDITIES", "ROLLOUT_NEGATIVE_PICKS"]

# The pair pipeline's choices (algo/selection.py says what each does).
NEGATIVE_SOURCES = Registry("--cooper.negative_source", ("assistant", "rollout", "mixed"))
NEGATIVE_VALIDITIES = Registry("--cooper.negative_validity", ("strict", "official"))
ROLLOUT_NEGATIVE_PICKS = Registry("--cooper.rollout_negative_pick", ("hardest", "random"))
