"""Negative sources are strategies looked up by name (algo/negative_sources/): each module registers one, an unknown
name fails listing the known ones, and the pair pipeline asks a source what to do instead of comparing its name, so
a source the pipeline has never heard of works through it unchanged."""

import pkgutil

import pytest

from cooper_openrlhf.algo import negative_sources
from cooper_openrlhf.algo.negative_sources import FROM_ASSISTANT, FROM_NONE, FROM_ROLLOUT, NEGATIVE_SOURCES
from cooper_openrlhf.algo.negative_sources.base import NegativeSource
from cooper_openrlhf.algo.selection import NO_ROLLOUT, assemble_pairs, assistant_prompts, plan_negatives


def test_every_module_of_the_package_is_a_registered_source_found_by_its_name():
    modules = sorted(m.name for m in pkgutil.iter_modules(negative_sources.__path__) if m.name != "base")
    assert modules == list(NEGATIVE_SOURCES) == ["assistant", "mixed", "rollout"]
    for name in modules:
        source = NEGATIVE_SOURCES[name]
        assert isinstance(source, NegativeSource) and source.name == name
    flags = {name: (NEGATIVE_SOURCES[name].reads_rollouts, NEGATIVE_SOURCES[name].writes_rewrites) for name in modules}
    assert flags == {"assistant": (False, True), "rollout": (True, False), "mixed": (True, True)}


def test_an_unknown_source_fails_naming_the_known_ones():
    message = r"^unknown --cooper.negative_source 'judge'; valid: \['assistant', 'mixed', 'rollout'\]$"
    with pytest.raises(ValueError, match=message):
        NEGATIVE_SOURCES["judge"]
    with pytest.raises(ValueError, match=message):
        plan_negatives([True, False], [False, True], None, 2, "judge")


@pytest.mark.parametrize("name, has_rollout, expected", [
    ("assistant", True, ("rewrite", FROM_ASSISTANT)), ("assistant", False, ("rewrite", FROM_ASSISTANT)),
    ("rollout", True, ("wrong", FROM_ROLLOUT)), ("rollout", False, ("", FROM_NONE)),
    ("mixed", True, ("wrong", FROM_ROLLOUT)), ("mixed", False, ("rewrite", FROM_ASSISTANT)),
])
def test_each_source_chooses_its_negative_and_asks_the_assistant_only_where_it_writes(name, has_rollout, expected):
    source = NEGATIVE_SOURCES[name]
    assert source.choose("wrong" if has_rollout else None, "rewrite") == expected
    asks = source.needs_rewrite(has_rollout)
    assert asks == (name == "assistant" or (name == "mixed" and not has_rollout))
    assert not asks or source.writes_rewrites


def test_a_new_source_needs_only_its_own_class_to_work_through_the_pipeline(monkeypatch):
    """A source the pipeline has never heard of: the assistant rewrites every positive, and a wrong rollout is
    taken only where the rewrite failed. Registered for this test only (its own module would `@register` it)."""

    class RewriteElseRollout(NegativeSource):
        name = "rewrite_first"
        reads_rollouts = writes_rewrites = True

        def needs_rewrite(self, has_rollout_negative: bool) -> bool:
            return True

        def choose(self, rollout, rewrite):
            return (rewrite, FROM_ASSISTANT) if rewrite else ((rollout, FROM_ROLLOUT) if rollout else ("", FROM_NONE))

    monkeypatch.setitem(NEGATIVE_SOURCES._entries, "rewrite_first", RewriteElseRollout())
    assert assistant_prompts([0, -1, 4], [True, False, False], "rewrite_first") == [0, 2]
    completions = ["\\boxed{1}", "\\boxed{7}", "\\boxed{2}", "\\boxed{2}", "\\boxed{3}", "\\boxed{8}"]
    pairs = assemble_pairs(["A", "B", "C"], ["1", "2", "3"], completions, positive_index=[0, 2, 4],
                           rollout_negative=[1, NO_ROLLOUT, 5], assistant_negatives={0: "\\boxed{5}"},
                           source="rewrite_first")
    assert pairs.negatives == ["\\boxed{5}", "", "\\boxed{8}"]
    assert pairs.negative_source == [FROM_ASSISTANT, FROM_NONE, FROM_ROLLOUT] and pairs.valid == [True, False, True]
