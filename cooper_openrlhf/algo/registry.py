"""The choices of the pair pipeline, in one registry each (`runtime.registry.Registry`).

They live here rather than in `algo.selection`, so `algo.negatives` (whose `NegativeConfig` checks its validity
rule) and `algo.selection` (which acts on all three) both read them without importing each other. The negative
sources are strategies, one module each, registered in `algo/negative_sources/`; the other two are bare names.
"""

from cooper_openrlhf.algo.negative_sources import NEGATIVE_SOURCES
from cooper_openrlhf.runtime.registry import Registry

__all__ = ["NEGATIVE_SOURCES", "NEGATIVE_VALIDITIES", "ROLLOUT_NEGATIVE_PICKS"]

# The pair pipeline's other choices (algo/selection.py says what each does).
NEGATIVE_VALIDITIES = Registry("--cooper.negative_validity", ("strict", "official"))
ROLLOUT_NEGATIVE_PICKS = Registry("--cooper.rollout_negative_pick", ("hardest", "random"))
