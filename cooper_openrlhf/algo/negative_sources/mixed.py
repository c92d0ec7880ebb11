"""mixed: a wrong rollout where the prompt has one, an assistant's rewrite for the prompts without one.

The assistant writes only for the gaps the rollouts leave, so fewer rewrites are generated than with `assistant`
while every prompt with a positive can still get a pair.
"""

from cooper_openrlhf.algo.negative_sources.base import FROM_ASSISTANT, FROM_ROLLOUT, NegativeSource, register


@register
class RolloutElseRewrite(NegativeSource):
    name = "mixed"
    reads_rollouts = True
    writes_rewrites = True

    def needs_rewrite(self, has_rollout_negative: bool) -> bool:
        return not has_rollout_negative

    def choose(self, rollout: str | None, rewrite: str) -> tuple[str, str]:
        return (rollout, FROM_ROLLOUT) if rollout is not None else (rewrite, FROM_ASSISTANT)
