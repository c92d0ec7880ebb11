"""What a negative source is: where a Cooper pair's negative comes from, one strategy per module of this package.

A source answers three questions the pair pipeline (`algo.selection`) and the start-up checks ask, and nothing
else depends on its name:
- may a prompt's own wrong rollout serve as its negative (`reads_rollouts`: then `--cooper.rollout_negative_pick`
  and `--cooper.answerless_negatives` apply);
- may an assistant be asked to rewrite the positive (`writes_rewrites`: then an assistant is needed and
  `--cooper.negative_validity` judges the rewrites), and for which prompts (`needs_rewrite`);
- which of a prompt's candidates becomes its negative (`choose`).
No torch and no engine here: the launchers' checks read the registry without loading a model library.
"""

from cooper_openrlhf.runtime.registry import Registry

# PairBatch.negative_source values: where each pair's negative came from ("" for a slot without a pair).
FROM_ASSISTANT, FROM_ROLLOUT, FROM_NONE = "assistant", "rollout", ""


class NegativeSource:
    """One way of finding a prompt's negative; subclasses set the two flags and implement the two methods."""

    name: str  # the registry's name, as `--cooper.negative_source` (and the service's --negative-source) take it
    reads_rollouts: bool  # a prompt's own rollout proved wrong may be its negative
    writes_rewrites: bool  # an assistant may be asked to rewrite the prompt's positive into a negative

    def needs_rewrite(self, has_rollout_negative: bool) -> bool:
        """Whether a prompt with a positive is given to the assistant, knowing whether it has a rollout negative."""
        raise NotImplementedError

    def choose(self, rollout: str | None, rewrite: str) -> tuple[str, str]:
        """(negative, where it came from) of a prompt with a positive.

        rollout: its chosen wrong rollout, normalised (None where it has none, or the source reads no rollouts).
        rewrite: the assistant's valid rewrite, normalised ("" where none).
        An empty negative, or one equal to the positive, is dropped afterwards (`selection.assemble_pairs`).
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"NegativeSource({self.name!r})"


NEGATIVE_SOURCES: Registry[NegativeSource] = Registry("--cooper.negative_source")


def register(source: type[NegativeSource]) -> type[NegativeSource]:
    """Class decorator: add one instance of `source` to NEGATIVE_SOURCES under `source.name`."""
    NEGATIVE_SOURCES.add(source.name, source())
    return source
