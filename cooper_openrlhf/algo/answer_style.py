"""Whether a completion is written in a given answer sentence (the style lab's S, lab/presets.py STYLE): the
warm start's and the stale pairs' style counts (lab/) and the plan's exploit rate (report/plan_verdict.py) read it the
same way. Pure."""

import re


def in_sentence(text: str, sentence: str) -> bool:
    """Whether `text` is `sentence` (with one `{answer}` field) with some integer answer, outer spaces aside."""
    stem, _, tail = sentence.partition("{answer}")
    return re.fullmatch(re.escape(stem) + r"-?\d+" + re.escape(tail), text.strip()) is not None
