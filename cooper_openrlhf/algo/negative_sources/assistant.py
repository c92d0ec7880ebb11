"""assistant: an assistant's rewrite of the positive (the paper's negatives, arXiv 2508.05613, sec. 3.2).

The assistant (the policy on its own engines, or another model) rewrites each prompt's verified-correct rollout
into a wrong solution; `--cooper.negative_validity` says which rewrites count (`algo.negatives`).
"""

from cooper_openrlhf.algo.negative_sources.base import FROM_ASSISTANT, NegativeSource, register


@register
class AssistantRewrite(NegativeSource):
    name = "assistant"
    reads_rollouts = False
    writes_rewrites = True

    def needs_rewrite(self, has_rollout_negative: bool) -> bool:
        return True

    def choose(self, rollout: str | None, rewrite: str) -> tuple[str, str]:
        return rewrite, FROM_ASSISTANT
