"""The reward model's input template: (question, reference answer, completion) -> one text.

Template "verifyrm-v1" (Cooper's VerifyRM input, arXiv 2508.05613 sec. 3.1)::

    <question>{question}</question>
    <reference_answer>{reference}</reference_answer>
    <completion>{completion}</completion>

(lines joined by a single "\\n", no trailing newline). The completion is first normalised
(`algo.negatives.normalize_solution`: reasoning before `</think>`, chat-control tokens and what follows them,
an announcing first line, a wrapping code fence and commentary after the last box go) here, so every path that
scores or trains an RM reads the same text by construction: the two sides of a pair, the rollouts it pays, the
anchors and probes, offline training and evaluation. The question is never cut. A reference or
completion longer than head_chars + tail_chars characters keeps its first `head_chars` (500) and
last `tail_chars` (1000) characters joined by `joiner` ("\\n...\\n"), so the final answer at the
end of a long completion is always seen. The joiner and both lengths are part of the version: a
change to any of them needs a new version name, since an RM trained on one cut misreads another.

A trained RM records its template with `template_config()` (saved under `CONFIG_KEY` in the
model config) and readers resolve it with `template_from_config`.
"""

from dataclasses import asdict, dataclass

from cooper_openrlhf.algo.negatives import normalize_solution
from cooper_openrlhf.runtime.registry import Registry

TEMPLATE_VERSION = "verifyrm-v1"
CONFIG_KEY = "cooper_rm_template"  # key of `template_config()` inside a saved model config


@dataclass(frozen=True)
class RMTemplate:
    """One versioned template: its format and how long fields are cut (lengths in characters)."""

    version: str
    format: str
    head_chars: int
    tail_chars: int
    joiner: str


_TEMPLATES = Registry("RM template version", {
    "verifyrm-v1": RMTemplate(
        version="verifyrm-v1",
        format=(
            "<question>{question}</question>\n"
            "<reference_answer>{reference}</reference_answer>\n"
            "<completion>{completion}</completion>"
        ),
        head_chars=500,
        tail_chars=1000,
        joiner="\n...\n",
    ),
})


def get_template(version: str = TEMPLATE_VERSION) -> RMTemplate:
    """The template named `version`; unknown names raise a ValueError listing the valid ones."""
    return _TEMPLATES[version]


def truncate_middle(text: str, head_chars: int, tail_chars: int, joiner: str) -> str:
    """`text` unchanged if it has at most head+tail characters, else head + joiner + tail."""
    if len(text) <= head_chars + tail_chars:
        return text
    return text[:head_chars] + joiner + text[len(text) - tail_chars :]


def render_rm_input(question: str, reference: str, completion: str, *, template_version: str = TEMPLATE_VERSION) -> str:
    """The text the reward model reads for one (question, reference answer, completion) triple; the completion
    normalised (`normalize_solution`, idempotent, so a completion normalised before reads the same)."""
    template = get_template(template_version)

    def cut(text: str) -> str:
        return truncate_middle(text, template.head_chars, template.tail_chars, template.joiner)

    solution = normalize_solution(completion)
    return template.format.format(question=question, reference=cut(reference), completion=cut(solution))


def template_config(version: str = TEMPLATE_VERSION) -> dict:
    """A JSON-able record of the template (version, format, cut lengths, joiner) for a model config."""
    return asdict(get_template(version))


def template_from_config(record: dict) -> RMTemplate:
    """The template a saved `template_config()` names; raises if its recorded settings differ from ours."""
    template = get_template(record["version"])
    recorded = {key: record[key] for key in asdict(template) if key in record}
    mismatched = {key: value for key, value in recorded.items() if getattr(template, key) != value}
    if mismatched:
        raise ValueError(
            f"template {template.version!r} was saved with {mismatched}, which differs from this code's "
            f"{ {key: getattr(template, key) for key in mismatched} }"
        )
    return template
