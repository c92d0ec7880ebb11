"""Find the final answer of a model completion: math-verify's own extraction, plus the two forms it lacks.

math-verify's `parse` already finds answers in the forms models write (``\\boxed{...}``, "final
answer is $...$", "answer: ...", ``$...$`` / ``\\(...\\)`` spans, bare ``\\frac12``, numbers such as
``1 000``, ``.4`` or ``50%``, relations such as ``x \\geq 5``), with its own priorities and
"rightmost match wins" rule. This module decides only *where* math-verify looks and *with which
settings*, in this order:

1. with a balanced, non-empty box, the whole completion, boxes first (``boxed_match_priority=0``;
   ``\\fbox`` read as ``\\boxed``);
2. with a GSM8K ``#### X`` line (and no box), only X: math-verify would otherwise take the
   rightmost number after it;
3. otherwise the whole completion, math-verify's priorities unchanged (an empty ``\\boxed{}``,
   such as the prompt's instruction echoed by the model, is ignored, as math-verify ignores it);
4. only when math-verify finds nothing at all: "the answer is X" (or the ``####`` line X) where X
   is a bare LaTeX expression (``\\sqrt{2}``), which math-verify's patterns do not reach without ``$``.

One answer form is graded apart (`rule.verify_one`): arithmetic on numerals (``9 - 5``, ``3 \\cdot 4``,
`unevaluated_arithmetic`) is the computation left to the grader, not its result; the result the completion states
for it (its last ``9 - 5 = 4``, `stated_result`) is graded instead, and without one the answer is wrong.

`fallback` maps onto math-verify's own switch: "last_number" is its unanchored extraction (the
rightmost LaTeX span or number anywhere, `try_extract_without_anchor=True`), "none" keeps only
anchored forms (box, ``####``, "final answer is", "answer:"). No hand-written "last number"
remains, so an unclosed ``\\boxed{1024`` or the 2 in an unboxed ``\\frac{1+\\sqrt{5}}{2}`` is no
answer, as in math-verify.

Two views of the same decision:
- `extraction_plan` + math-verify's `parse` (what `rule.verify_one` grades: the parsed objects
  themselves, never a re-parse of a string);
- `extract_answer`: the answer as a string, from math-verify's regular expressions and LaTeX
  normalisation only (no sympy). It is cheap and cannot hang, so the pool's dispatcher and the
  pair builder may call it in-process; it names the match `parse` tries first, which is the one
  graded unless sympy fails on it.
"""

import re
from dataclasses import dataclass, replace

from cooper_openrlhf.runtime.registry import Registry

FALLBACKS = Registry("answer fallback", ("last_number", "none"))

# Tokens that matter for brace matching. `\{` and `\}` are LaTeX set braces, not grouping.
_BRACE_TOKEN = re.compile(r"\\(?:boxed|fbox)[ \t]{0,8}\{|\\[{}]|[{}]")
_GSM8K_ANCHOR = re.compile(r"####[ \t]{0,8}")
_ANSWER_ANCHOR = re.compile(
    r"(?:the[ \t]{1,4})?(?:final[ \t]{1,4})?answer(?:[ \t]{1,4}is|[ \t]{0,4}:)[ \t:]{0,8}\n?[ \t]{0,8}", re.IGNORECASE
)
# A bare LaTeX answer: once command names are removed, no word of two or more letters is left
# ("\frac{1+\sqrt{5}}{2}", "x \geq 5"), so prose after "the answer is" is never taken as math.
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{2,}")
_CURRENCY_NUMBER = re.compile(r"\$(-?\d[\d,]{0,64}(?:\.\d{1,64})?)")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_MAX_ANCHORED_ANSWER_CHARS = 1000  # a phrase answer longer than this is prose, not an answer


def last_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}``/``\\fbox{...}``; None when there is none.

    "Last" means the box that closes last; for nested boxes that is the outermost one, whose
    content is unwrapped while it is itself exactly one box (``\\boxed{\\boxed{5}}`` gives ``5``).
    One left-to-right pass records every closed box, so unwrapping is a lookup per level and the
    whole call is linear in the text, however deep the nesting.
    """
    stack: list[tuple[int, int]] = []  # (macro start, content start) of a box opener; (-1, -1) for a plain `{`
    closed: dict[int, tuple[int, int]] = {}  # macro start -> (content start, closing-brace position)
    best: tuple[int, int] | None = None  # (content start, content end) of the last closed box
    for token in _BRACE_TOKEN.finditer(text):
        lexeme = token.group()
        if lexeme in ("\\{", "\\}"):
            continue
        if lexeme == "{":
            stack.append((-1, -1))
        elif lexeme == "}":
            if not stack:
                continue  # stray closer: ignore rather than give up on later boxes
            macro_start, content_start = stack.pop()
            if content_start >= 0:
                closed[macro_start] = best = (content_start, token.start())
        else:
            stack.append((token.start(), token.end()))
    if best is None:
        return None
    start, end = best
    while True:
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        inner = closed.get(start)
        if inner is None or inner[1] != end - 1:  # not exactly one box spanning the whole content
            return text[start:end]
        start, end = inner


def _after_last(anchor: re.Pattern[str], text: str) -> str | None:
    """The rest of the line after the last `anchor` match (the next line if the anchor ends its line)."""
    last = None
    for last in anchor.finditer(text):
        pass
    if last is None:
        return None
    start = last.end()
    line_end = text.find("\n", start)
    line = text[start : line_end if line_end >= 0 else len(text)]
    return line if len(line) <= _MAX_ANCHORED_ANSWER_CHARS else None


def _bare_latex(phrase: str) -> str | None:
    """`phrase` without its trailing punctuation when it is a bare LaTeX expression (no prose), else None."""
    phrase = phrase.strip().rstrip(" .;")
    rest = _LATEX_COMMAND.sub(" ", phrase)  # what is left besides command names must hold a symbol or digit
    if "\\" not in phrase or _WORD.search(rest) or not re.search(r"[0-9A-Za-z]", rest):
        return None
    return phrase


def fallback_phrase(completion: str, plan: "ExtractionPlan") -> str | None:
    """Step 4: the bare LaTeX answer after "the answer is" (or of the `####` line), for when math-verify finds nothing."""
    phrase = plan.text if plan.anchored_only else _after_last(_ANSWER_ANCHOR, completion)
    return _bare_latex(phrase) if phrase is not None else None


def extraction_configs(fallback: str) -> list:
    """math-verify's extraction targets for `fallback`: LaTeX (boxes first) and plain expressions."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    FALLBACKS.check(fallback)
    unanchored = fallback == "last_number"
    return [
        LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=unanchored),
        ExprExtractionConfig(try_extract_without_anchor=unanchored),
    ]


@dataclass(frozen=True)
class ExtractionPlan:
    """Where math-verify looks and how. text: the completion, or the X of its `#### X` line."""

    text: str
    configs: list
    anchored_only: bool  # True when `text` is the `####` answer itself: its bare form counts


def extraction_plan(completion: str, fallback: str = "last_number") -> ExtractionPlan:
    """Steps 1-3 of the module docstring."""
    configs = extraction_configs(fallback)
    boxed = last_boxed(completion)
    if boxed:  # an empty box (often the prompt's instruction echoed) is no answer and does not hide a later one
        # math-verify knows only \boxed; \fbox is the same box (Minerva-style graders accept both).
        return ExtractionPlan(completion.replace("\\fbox{", "\\boxed{"), configs, False)
    gsm8k = _after_last(_GSM8K_ANCHOR, completion)
    if gsm8k is not None:
        # The marker is the anchor: anything math-verify finds in the rest of that line counts.
        return ExtractionPlan(gsm8k, extraction_configs("last_number"), True)
    return ExtractionPlan(completion, configs, False)


def _match_string(match: re.Match, target) -> str:
    """The answer string math-verify's `extract_match` would report for `match`, without parsing it."""
    from latex2sympy2_extended.latex2sympy2 import normalize_latex
    from math_verify import LatexExtractionConfig

    groups = {name: value for name, value in match.groupdict().items() if value}
    if isinstance(target, LatexExtractionConfig):
        parts = []
        for name, latex in groups.items():
            if "_latex" not in name:
                continue
            config = target.normalization_config
            if name.endswith("_latexBoxed"):
                config = replace(config, boxed="last")
            parts.append(normalize_latex(latex, config=config))
        return " and ".join(parts)
    integer = next((v for k, v in groups.items() if k.startswith("integer")), "")
    decimal = next((v for k, v in groups.items() if k.startswith("decimal")), "")
    if integer or decimal:
        integer = integer.translate(str.maketrans("", "", ", ")).lstrip("0") or "0"
        return integer + decimal.replace(",", ".")
    return groups.get("expr", "")


def first_match_string(text: str, configs: list) -> str | None:
    """The match math-verify's `parse(text, configs)` tries first (best priority, rightmost), as a string."""
    from itertools import groupby

    from math_verify.parser import get_extraction_regexes

    patterns = [
        (pattern, target, priority)
        for target_patterns, target in get_extraction_regexes(configs)
        for pattern, priority in target_patterns
    ]
    patterns.sort(key=lambda item: item[2])
    for _, group in groupby(patterns, key=lambda item: item[2]):
        matches = [(match, target) for pattern, target, _ in group for match in pattern.finditer(text)]
        if matches:
            match, target = max(matches, key=lambda item: (item[0].end(), -item[0].start()))
            found = _match_string(match, target)
            if found:
                return found
    return None


def normalize_answer(answer: str) -> str | None:
    """Strip what is never part of an answer: whitespace, `$` delimiters, trailing `.`, thousands commas.

    Returns None when nothing is left.
    """
    answer = answer.strip().rstrip(" .;").strip()
    while len(answer) >= 2 and answer.startswith("$") and answer.endswith("$"):
        answer = answer[1:-1].strip()
    currency = _CURRENCY_NUMBER.fullmatch(answer)
    if currency:
        answer = currency.group(1)
    if _THOUSANDS.fullmatch(answer):
        answer = answer.replace(",", "")
    return answer or None


# Arithmetic on numerals as a final answer. math-verify evaluates it, and its "final answer is" pattern stops before
# an "=", so "The final answer is 9 - 5 = 7." grades as 9 - 5 = 4: a policy that restates the question's own
# expression is paid on every problem whatever it computes (SmolLM2 under the rule reward learned it within 30
# GRPO steps on digit sums; docs/lab/notebook.md, "Policy-response pilot 3"). Division is left out: "3/4" is a
# fraction, an answer's usual form.
_NUMERAL = r"-?\d+(?:\.\d+)?"
_OPERATOR = r"(?:[-+*×]|\\cdot|\\times)"
_ARITHMETIC = re.compile(rf"{_NUMERAL}(?:\s*{_OPERATOR}\s*{_NUMERAL})+")
_TOKEN = re.compile(rf"\d+(?:\.\d+)?|{_OPERATOR}")


def unevaluated_arithmetic(answer: str) -> bool:
    """True when `answer` is arithmetic on numerals (``9 - 5``, ``7 + 2.``, ``3 \\cdot 4``): no result stated."""
    return _ARITHMETIC.fullmatch(normalize_answer(answer) or "") is not None


def stated_result(completion: str, expression: str) -> str | None:
    """The result `completion` states for `expression`: the number after "=" at its last "9 - 5 = N", spaced as it
    may be ("9 - 5 = 4" -> "4"; a result that is arithmetic again is none), or None."""
    tokens = _TOKEN.findall(normalize_answer(expression) or "")
    if not tokens:
        return None
    # Not inside a longer number ("19 - 5 = 14" states nothing for "9 - 5"); a result that is arithmetic again is none.
    expression_pattern = r"(?<![\d.])" + r"\s*".join(re.escape(token) for token in tokens)
    pattern = expression_pattern + rf"\s*=\s*\$?\s*({_NUMERAL})(?![\d.]*\s*{_OPERATOR}\s*\d)"
    results = re.findall(pattern, completion)
    return results[-1] if results else None


def extract_answer(completion: str, fallback: str = "last_number") -> str | None:
    """The final answer of `completion` as a normalised string, or None when none is found.

    `fallback` ("last_number" or "none") picks whether unanchored LaTeX spans and numbers count
    (see the module docstring). String-only and cheap: safe anywhere, including a dispatcher thread.
    """
    plan = extraction_plan(completion, fallback)
    found = first_match_string(plan.text, plan.configs)
    if found is None:
        found = fallback_phrase(completion, plan)
    return normalize_answer(found) if found is not None else None
