"""rollout: one of the prompt's own rollouts whose answer is proved different from the reference.

No generation: the negative is already among the step's rollouts, picked by `--cooper.rollout_negative_pick`
(`selection.select_rollout_negatives`); with `--cooper.answerless_negatives` a rollout without a final answer is a
candidate too. A prompt none of whose rollouts is wrong has no pair.
"""

from cooper_openrlhf.algo.negative_sources.base import FROM_NONE, FROM_ROLLOUT, NegativeSource, register


@register
class WrongRollout(NegativeSource):
    name = "rollout"
    reads_rollouts = True
    writes_rewrites = False

    def needs_rewrite(self, has_rollout_negative: bool) -> bool:
        return False

    def choose(self, rollout: str | None, rewrite: str) -> tuple[str, str]:
        return (rollout, FROM_ROLLOUT) if rollout is not None else ("", FROM_NONE)
