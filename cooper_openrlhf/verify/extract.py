"""Extract the final answer from a model completion.

Anchored forms are tried in a fixed order, and the first that is present wins:

1. the last balanced ``\\boxed{...}`` or ``\\fbox{...}`` (what the policy is prompted to write);
2. the last GSM8K-style ``#### X`` line;
3. the last "the answer is X" / "final answer: X" phrase;
4. the configured fallback: ``"last_number"`` (the last number in the text) or ``"none"``.

For 2 and 3, X is the rest of the line (or of the next line when the anchor ends its line),
cut to its ``$...$`` span when it opens with one (Minerva's "The final answer is $5$. I hope it is
correct."); "18 dollars" (a number and plain words) gives "18".

Every scan is linear in the input: braces are matched with one left-to-right token pass and
all regular expressions use bounded quantifiers, so a 100 KB completion costs milliseconds.
The extracted string is lightly normalised (surrounding ``$`` and trailing punctuation removed,
thousands separators in plain numbers such as ``1,000`` dropped); the comparison itself is
math-verify's job (see `rule.py`).
"""

import re

FALLBACKS = ("last_number", "none")

# Tokens that matter for brace matching. `\{` and `\}` are LaTeX set braces, not grouping.
_BRACE_TOKEN = re.compile(r"\\(?:boxed|fbox)[ \t]{0,8}\{|\\[{}]|[{}]")
_GSM8K_ANCHOR = re.compile(r"####[ \t]{0,8}")
_ANSWER_ANCHOR = re.compile(
    r"(?:the[ \t]{1,4})?(?:final[ \t]{1,4})?answer(?:[ \t]{1,4}is|[ \t]{0,4}:)[ \t:]{0,8}\n?[ \t]{0,8}", re.IGNORECASE
)
# "18 dollars", "$18 per week": a number followed only by plain words (units) -> the number.
_NUMBER_THEN_WORDS = re.compile(r"\$?(-?\d[\d,]{0,64}(?:\.\d{1,64})?)[ \t]+[A-Za-z][A-Za-z \t]{0,40}")
_CURRENCY_NUMBER = re.compile(r"\$(-?\d[\d,]{0,64}(?:\.\d{1,64})?)")
_NUMBER = re.compile(r"-?\d[\d,]{0,64}(?:\.\d{1,64})?")
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


def _phrase_after_last(anchor: re.Pattern[str], text: str) -> str | None:
    """What follows the last `anchor` match: a `$...$` span if one opens there, else the rest of the line."""
    last = None
    for last in anchor.finditer(text):
        pass
    if last is None:
        return None
    start = last.end()
    line_end = text.find("\n", start)
    line = text[start : line_end if line_end >= 0 else len(text)]
    if line.startswith("$"):
        # Minerva style "The final answer is $5$. I hope it is correct.": keep only the math span.
        delimiter = "$$" if line.startswith("$$") else "$"
        close = line.find(delimiter, len(delimiter))
        if close > 0:
            line = line[: close + len(delimiter)]
    if len(line) > _MAX_ANCHORED_ANSWER_CHARS:
        return None
    number_with_unit = _NUMBER_THEN_WORDS.fullmatch(line.strip().rstrip("."))
    return number_with_unit.group(1) if number_with_unit else line


def last_number(text: str) -> str | None:
    """The last integer or decimal in `text` (sign and thousands separators kept), or None."""
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return last.group().rstrip(",") if last else None


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


def extract_answer(completion: str, fallback: str = "last_number") -> str | None:
    """The final answer of `completion` as a normalised string, or None when none is found.

    `fallback` picks what happens when no anchored form is present: "last_number" or "none".
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"unknown answer fallback {fallback!r}; valid: {list(FALLBACKS)}")
    for find in (
        last_boxed,
        lambda text: _phrase_after_last(_GSM8K_ANCHOR, text),
        lambda text: _phrase_after_last(_ANSWER_ANCHOR, text),
    ):
        found = find(completion)
        if found is not None:
            # An anchor with nothing after it is no answer; do not fall through to a weaker form.
            return normalize_answer(found)
    if fallback == "last_number":
        number = last_number(completion)
        return normalize_answer(number) if number is not None else None
    return None
