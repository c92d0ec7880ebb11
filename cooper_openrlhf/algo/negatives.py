"""Cooper's negatives: the rewrite prompt sent to the assistant, the cleaning of its reply, and its config.

Cooper (arXiv 2508.05613, sec. 3.2) builds the RM's negative for a prompt by asking an assistant LLM
to turn a verified-correct rollout (the positive) into a plausible but wrong solution. The
prompt below is ours: it asks for one believable mistake carried through to a different final
answer in ``\\boxed{}``, in the positive's own style, with no hint that anything is wrong (a
negative that announces its error teaches the RM to look for the announcement, not the error).

Whether a reply is a usable negative is decided elsewhere (`core.pair_builder` with
`algo.selection.negative_is_valid`): by default its answer must be verified different from the positive's. Here the text is only normalised (`normalize_solution`),
and the same normalisation is applied to BOTH sides of every pair and to every completion the RM
scores (`algo.template.render_rm_input` applies it to every RM input): a normalisation of one side only would let
the RM learn the formatting difference (e.g. "text after the final box means correct") instead of correctness.

1. reasoning before a closing ``</think>`` is dropped (reasoning-model assistants);
2. the reply is cut at the first chat-control token (``<|im_end|>``, ``<|eot_id|>``, ``</s>``,
   ``<|user|>``...): anything after one is the model writing another turn;
3. an opening line announcing the solution and ending with ":" ("Here is the rewritten solution:") goes;
4. a code fence wrapping the whole reply is unwrapped;
5. commentary after the line that holds the last ``\\boxed{...}`` goes ("Note: I changed 3 to 4");
   a solution ends with its final answer.
"""

import re
from dataclasses import dataclass

from cooper_openrlhf.algo.registry import NEGATIVE_VALIDITIES

REWRITE_SYSTEM = (
    "You help build training data for a grader of math solutions. Given a correct solution, you "
    "write a convincing but incorrect version of it, the kind of solution a capable student "
    "could hand in by mistake."
)
REWRITE_USER = (
    "Problem:\n{question}\n\n"
    "Correct solution:\n{solution}\n\n"
    "Rewrite this solution so that it contains one plausible mistake, such as an arithmetic slip, "
    "a sign error, a misread number or a wrong step, and carry the mistake through so that the "
    "final answer changes{answer_hint}. Keep the same style, format and roughly the same length. "
    "Write it as if it were correct: do not mention, mark or explain the mistake. "
    "End with the new final answer in \\boxed{{}}. Reply with the rewritten solution only."
)
_ANSWER_HINT = " (the correct final answer is {answer}; yours must be different)"

# <|im_end|>, <|eot_id|>, <|user|>, <|endoftext|>, </s>, <end_of_turn>, [INST]: chat control, never solution text.
_CHAT_CONTROL = re.compile(r"<\|[A-Za-z0-9_ ]{1,40}\|>|</s>|<s>|<(?:start|end)_of_turn>|\[/?INST\]")
# A first line that announces the solution ("Here is the rewritten solution:", "Incorrect version:").
_PREAMBLE = re.compile(
    r"\A[^\n]{0,120}\b(?:solution|version|rewrite|rewritten)\b[^\n]{0,80}:[ \t]*\n", re.IGNORECASE
)
_FENCE = re.compile(r"\A```[A-Za-z]{0,16}[ \t]*\n(.*)\n```\Z", re.DOTALL)
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)[ \t]{0,8}\{")


@dataclass(frozen=True)
class NegativeConfig:
    """How negatives are sampled from the assistant.

    retries: attempts per prompt; attempt k only re-asks for prompts still without a valid negative.
    max_new_tokens / temperature / top_p: sampling of each rewrite (temperature 0 is greedy, which
        makes every retry repeat the first attempt on the same prompt).
    seed: base seed; each request's seed is derived from it, the step and the attempt, so a run
        is reproducible.
    answer_fallback: how a rewrite's final answer is found (`verify.extract` fallbacks). "none" (the
        default) accepts only an explicit one (\\boxed{}, "####", "the answer is"), as the prompt asks:
        with "last_number", rambling text whose last number happens to differ would count as a valid
        negative, and a correct rewrite whose last number is not its answer would be mislabelled.
    """

    retries: int = 3
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    answer_fallback: str = "none"
    validity: str = "strict"  # which rewrites count as negatives: `algo.selection.negative_is_valid`

    def __post_init__(self) -> None:
        try:
            NEGATIVE_VALIDITIES.check(self.validity)
        except ValueError as exc:
            raise ValueError(f"NegativeConfig.validity: {exc}") from None
        for name in ("retries", "max_new_tokens", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"NegativeConfig.{name} must be an int, got {value!r}")
        if self.retries < 1:
            raise ValueError(f"NegativeConfig.retries must be >= 1 (attempts per prompt), got {self.retries}")
        if self.max_new_tokens < 1:
            raise ValueError(f"NegativeConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.seed < 0:
            raise ValueError(f"NegativeConfig.seed must be >= 0, got {self.seed}")
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"NegativeConfig.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"NegativeConfig.top_p must be in (0, 1], got {self.top_p}")


def build_rewrite_messages(
    question: str, positive_completion: str, positive_answer: str | None = None
) -> list[dict[str, str]]:
    """The chat asking the assistant to rewrite `positive_completion` (a correct solution) into a wrong one.

    positive_answer: the positive's extracted final answer; when given, the prompt names it as the
    answer to move away from (small assistants otherwise often copy it).
    """
    if not isinstance(question, str) or not isinstance(positive_completion, str):
        raise TypeError("question and positive_completion must be str")
    if not positive_completion.strip():
        raise ValueError("positive_completion is empty: there is nothing to rewrite")
    hint = _ANSWER_HINT.format(answer=positive_answer) if positive_answer else ""
    user = REWRITE_USER.format(question=question.strip(), solution=positive_completion.strip(), answer_hint=hint)
    return [{"role": "system", "content": REWRITE_SYSTEM}, {"role": "user", "content": user}]


def normalize_solution(reply: str) -> str:
    """The solution text of a completion or an assistant reply (the module docstring lists what goes); may be "".

    Idempotent: the steps are repeated until the text stops changing, since one pass can uncover more to clean (a
    fence around an announcing line, two announcing lines), and the RM template normalises text that the pairs
    have normalised already. Every pass only deletes, so this ends."""
    while True:
        cleaned = _normalize_once(reply)
        if cleaned == reply:
            return cleaned
        reply = cleaned


def _normalize_once(reply: str) -> str:
    """One pass of `normalize_solution`'s steps, in the module docstring's order."""
    think_end = reply.rfind("</think>")
    if think_end >= 0:
        reply = reply[think_end + len("</think>") :]
    control = _CHAT_CONTROL.search(reply)
    if control:
        reply = reply[: control.start()]
    reply = reply.strip()
    reply = _PREAMBLE.sub("", reply, count=1).strip()
    fenced = _FENCE.match(reply)
    if fenced:
        reply = fenced.group(1).strip()
    return _cut_after_last_box_line(reply)


def _cut_after_last_box_line(text: str) -> str:
    """`text` up to the end of the line where its last box closes (unchanged when it has no box)."""
    last_open = None
    for last_open in _BOX_OPEN.finditer(text):
        pass
    if last_open is None:
        return text
    depth, position = 1, last_open.end()
    while position < len(text) and depth:
        char = text[position]
        if char == "\\" and position + 1 < len(text) and text[position + 1] in "{}":
            position += 2  # \{ and \} are literal braces, not grouping
            continue
        depth += {"{": 1, "}": -1}.get(char, 0)
        position += 1
    if depth:  # unclosed box: keep everything, the answer extractor decides
        return text
    line_end = text.find("\n", position)
    return text if line_end < 0 else text[:line_end].rstrip()
