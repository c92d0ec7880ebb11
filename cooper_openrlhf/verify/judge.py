"""LLM judge: ask a generation engine whether a completion's final answer matches the reference.

The prompt (ours, `JUDGE_SYSTEM` + `JUDGE_USER`) shows the question, the reference answer and the
completion (cut like the RM template: first 500 + last 1000 characters), asks the model to
compare only final answers, and to end its reply with a single word, Yes or No. The verdict is
the LAST standalone "yes" or "no" (any case, whole word) in the reply; a reply with neither is
UNDECIDED, which callers should treat as "not verified correct".
"""

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cooper_openrlhf.algo.template import get_template, truncate_middle
from cooper_openrlhf.engines.base import GenerationEngine, SamplingConfig

JUDGE_SYSTEM = (
    "You are a careful math grader. You compare the final answer of a student's solution with a "
    "reference answer. Equivalent forms count as a match (for example 1/2 and 0.5, or reordered "
    "elements of a set). Ignore the reasoning; only the final answer matters."
)
JUDGE_USER = (
    "Question:\n{question}\n\n"
    "Reference answer:\n{reference}\n\n"
    "Student solution:\n{completion}\n\n"
    "Does the student's final answer match the reference answer? "
    "Think briefly if needed, then end your reply with one word on its own line: Yes or No."
)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


class JudgeVerdict(str, enum.Enum):
    YES = "yes"  # the judge says the final answer matches the reference
    NO = "no"
    UNDECIDED = "undecided"  # the reply holds no standalone yes/no


@dataclass(frozen=True)
class Judgement:
    verdict: JudgeVerdict
    reply: str


def build_judge_messages(question: str, reference: str, completion: str) -> list[dict[str, str]]:
    """The chat sent to the judge for one (question, reference, completion)."""
    template = get_template()
    completion = truncate_middle(completion, template.head_chars, template.tail_chars, template.joiner)
    return [
        {"role": "system", "content": JUDGE_SYSTEM},
        {"role": "user", "content": JUDGE_USER.format(question=question, reference=reference, completion=completion)},
    ]


def parse_judgement(reply: str) -> JudgeVerdict:
    """The last standalone yes/no word of `reply`, or UNDECIDED."""
    last = None
    for last in _YES_NO.finditer(reply):
        pass
    if last is None:
        return JudgeVerdict.UNDECIDED
    return JudgeVerdict.YES if last.group(1).lower() == "yes" else JudgeVerdict.NO


class LLMJudge:
    """Judges batches with one engine; greedy and short by default."""

    def __init__(self, engine: GenerationEngine, sampling: SamplingConfig = SamplingConfig(max_new_tokens=64)):
        if sampling.n != 1:
            raise ValueError(f"the judge reads one reply per item; got sampling.n={sampling.n}")
        self.engine = engine
        self.sampling = sampling

    def judge(self, questions: Sequence[str], references: Sequence[str], completions: Sequence[str]) -> list[Judgement]:
        """One Judgement per (question, reference, completion), in input order."""
        if not len(questions) == len(references) == len(completions):
            raise ValueError("questions, references and completions must have the same length")
        prompts = [build_judge_messages(q, r, c) for q, r, c in zip(questions, references, completions)]
        replies = self.engine.generate(prompts, self.sampling)
        if len(replies) != len(prompts):
            raise RuntimeError(f"engine returned {len(replies)} replies for {len(prompts)} prompts")
        return [Judgement(parse_judgement(reply), reply) for reply in replies]
