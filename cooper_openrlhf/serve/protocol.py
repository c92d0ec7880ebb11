"""The reward service's wire protocol: OpenRLHF's remote-RM request in, its response out; pure functions.

OpenRLHF 0.11.2 (`openrlhf/utils/agent.py`, `SingleTurnAgentExecutor._fetch_rewards_via_http`) POSTs one finished
sample per request::

    {"query": [prompt + response, decoded with special tokens], "prompts": [the templated prompt], "labels": [label]}

and reads ``{"rewards": [...], "scores": [...], "extra_logs": {name: [...]}}``, one value per query (each
extra_logs value becomes a per-sample `info[name]` tensor it logs). A request may carry several samples (the TRL
and verl clients send a batch); every list must then have one entry per query.

What the RM reads is (raw question, reference = the label, completion): `PromptSplitter` recovers them, by the
rules of docs/serve.md ("What the RM reads of a prompt"): the question of a one-message chat prompt, the last user
message of a conversation, the completion after the prompt or, when OpenRLHF cut a too-long prompt's head, after
the prompt's tail that the query starts with; special tokens removed as the trainer's own decode removes them.
"""

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FIELDS = ("query", "prompts", "labels")
_SENTINEL = "\u2063COOPER-QUESTION\u2063"  # a question no dataset holds (invisible separators around a word)


class RequestError(ValueError):
    """A request the service cannot score; `status` is the HTTP status to answer with (400 or 413)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Sample:
    """One rollout as the RM and the learner see it."""

    prompt: str  # the templated prompt (the group key: the n samples of a prompt share it)
    question: str  # raw question recovered from the prompt
    reference: str  # the label: the reference answer
    completion: str  # the response text, special tokens removed


def parse_request(body: object, max_samples: int) -> tuple[list[str], list[str], list[str]]:
    """(queries, prompts, labels) of a decoded JSON body; a RequestError naming the field otherwise."""
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object with fields {list(FIELDS)}, got {type(body).__name__}")
    columns = []
    for name in FIELDS:
        if name not in body:
            raise RequestError(f"field {name!r} is missing (OpenRLHF sends {list(FIELDS)})")
        value = body[name]
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list):
            raise RequestError(f"field {name!r} must be a list of strings, got {type(value).__name__}")
        for i, item in enumerate(value):
            if name == "labels" and isinstance(item, (int, float)) and not isinstance(item, bool):
                value[i] = item = str(item)  # a numeric label is a reference answer too
            if not isinstance(item, str):
                raise RequestError(f"field {name!r}[{i}] must be a string, got {type(item).__name__}")
        columns.append(value)
    sizes = {name: len(column) for name, column in zip(FIELDS, columns)}
    if len(set(sizes.values())) != 1:
        raise RequestError(f"fields disagree in length: {sizes}; each needs one entry per sample")
    if not columns[0]:
        raise RequestError("field 'query' is empty: nothing to score")
    if len(columns[0]) > max_samples:
        raise RequestError(f"{len(columns[0])} samples in one request; at most {max_samples} (--max-request-samples)",
                           status=413)
    for i, label in enumerate(columns[2]):
        if not label.strip():
            raise RequestError(f"field 'labels'[{i}] is empty: the reference answer is needed to score a sample")
    return columns[0], columns[1], columns[2]


def build_response(rewards: Sequence[float], extra_logs: dict[str, Sequence[float]]) -> dict:
    """The body OpenRLHF reads: rewards, the same values as scores, and per-sample extra logs."""
    rewards = [float(r) for r in rewards]
    return {"rewards": rewards, "scores": list(rewards), "extra_logs": {k: [float(v) for v in vs]
                                                                        for k, vs in extra_logs.items()}}


class PromptSplitter:
    """Recovers (question, completion) from OpenRLHF's (prompt, query) for one prompt format (the rules are in
    docs/serve.md, "What the RM reads of a prompt").

    chat_template: a callable messages -> templated prompt (the policy tokenizer's `apply_chat_template` with a
        generation prompt, as OpenRLHF's `preprocess_data`), or None when prompts are not chat-templated.
    input_template: OpenRLHF's `--data.input_template` ("...{}..."), applied to the question when prompts are not
        chat-templated, or None.
    special_tokens: the policy tokenizer's special-token strings, removed from the completion.

    The n samples of a group share one prompt, so each prompt's question is worked out once (`cache_size` prompts).
    Every step is linear in the prompt's and query's lengths; `split` may run in several threads at once.
    """

    def __init__(self, chat_template=None, input_template: str | None = None, special_tokens: Sequence[str] = (),
                 cache_size: int = 4096):
        if input_template is not None and input_template.count("{}") != 1:
            raise ValueError(f"input_template must hold exactly one '{{}}', got {input_template!r}")
        self._chat = chat_template
        self._input_template = input_template
        self._special = sorted((t for t in special_tokens if t), key=len, reverse=True)
        rendered = self.render(_SENTINEL)
        if rendered.count(_SENTINEL) != 1:
            raise ValueError("the prompt template does not place the question exactly once; cannot split prompts")
        self._prefix, self._suffix = rendered.split(_SENTINEL)
        self._turn_opener = self._last_user_turn_opener() if chat_template else None
        self._questions: dict[str, str] = {}  # prompt -> question, insertion-ordered: the oldest is dropped first
        self._cache_size = cache_size
        self._cache_lock = threading.Lock()

    @classmethod
    def from_tokenizer(cls, tokenizer, apply_chat_template: bool = True, input_template: str | None = None):
        """The splitter of a policy whose prompts OpenRLHF built with this tokenizer (`preprocess_data`)."""
        chat = None
        if apply_chat_template:
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError("the policy tokenizer has no chat template; pass --no-chat-template if prompts are "
                                 "the questions themselves")

            def chat(messages: list[dict]) -> str:
                return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return cls(chat, input_template, tokenizer.all_special_tokens)

    def render(self, question: str) -> str:
        """The prompt OpenRLHF builds from `question` (a dataset row holding one user message)."""
        if self._chat:
            return self._chat([{"role": "user", "content": question}])
        return self._input_template.replace("{}", question) if self._input_template else question

    def _last_user_turn_opener(self) -> str:
        """The text every rendering puts right before the last user message, whatever comes earlier (a system
        prompt, earlier turns): the common end of what precedes the question in a few conversations."""
        befores = [self._prefix]
        for earlier in ([{"role": "system", "content": "S"}],
                        [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]):
            try:
                rendered = self._chat([*earlier, {"role": "user", "content": _SENTINEL}])
            except Exception:  # a template that refuses the role (no system turn, say) has no such prompts either
                continue
            if rendered.count(_SENTINEL) == 1 and rendered.endswith(self._suffix):
                befores.append(rendered.split(_SENTINEL)[0])
        opener = befores[0]
        for before in befores[1:]:
            common = 0
            while common < min(len(opener), len(before)) and opener[-1 - common] == before[-1 - common]:
                common += 1
            opener = opener[len(opener) - common:]
        return opener

    def question_of(self, prompt: str) -> str:
        """The raw question inside `prompt` (cached per prompt); a RequestError when none can be recovered."""
        question = self._questions.get(prompt)
        if question is None:
            question = self._recover_question(prompt)
            with self._cache_lock:  # a long prompt is split in a worker thread, a short one on the event loop
                if len(self._questions) >= self._cache_size:
                    del self._questions[next(iter(self._questions))]
                self._questions[prompt] = question
        return question

    def _recover_question(self, prompt: str) -> str:
        if prompt.startswith(self._prefix) and prompt.endswith(self._suffix) \
                and len(prompt) >= len(self._prefix) + len(self._suffix):
            question = prompt[len(self._prefix): len(prompt) - len(self._suffix)]
            # A conversation also renders back as one user message holding its turns' markup: keep its last turn.
            if self.render(question) == prompt and not (self._turn_opener and self._turn_opener in question):
                return question
        if self._turn_opener and prompt.endswith(self._suffix):
            # A system prompt or several turns: the RM reads the last user message.
            head = prompt[: len(prompt) - len(self._suffix)]
            at = head.rfind(self._turn_opener)
            if at >= 0:
                return head[at + len(self._turn_opener):]
        hint = " (if the prompts are the questions themselves, start the service with --no-chat-template)" \
            if self._chat else ""
        raise RequestError(f"prompt does not match the policy's prompt template (expected it to start with "
                           f"{self._prefix[-60:]!r} and end with {self._suffix[:60]!r}){hint}: {prompt[:120]!r}")

    def completion_of(self, prompt: str, query: str) -> str:
        """The response text of `query` (= prompt + response, or the prompt's tail + response when OpenRLHF cut the
        prompt's head to fit its max length), special tokens removed."""
        if query.startswith(prompt):
            completion = query[len(prompt):]
        else:
            completion = self._after_truncated_prompt(prompt, query)
        for token in self._special:
            completion = completion.replace(token, "")
        return completion

    def _after_truncated_prompt(self, prompt: str, query: str) -> str:
        """OpenRLHF keeps a too-long prompt's last tokens (`prompt_token_ids[-max_prompt_length:]`) and sends the
        decode of those + the response as the query, with the whole prompt beside it. The query then starts with a
        tail of the prompt, after at most a few characters that the cut token decodes to on its own."""
        tail_needed = max(len(self._suffix), min(len(prompt), _MIN_TRUNCATED_OVERLAP))
        for skip in range(_CUT_TOKEN_CHARS + 1):
            if prompt.find(query[skip: skip + tail_needed]) < 0:  # a long enough overlap starts with these
                continue
            overlap = _longest_prefix_that_ends(query[skip: skip + len(prompt)], prompt)
            if overlap >= tail_needed:
                return query[skip + overlap:]
        raise RequestError(f"query does not start with its prompt nor with a tail of it (query {query[:80]!r}..., "
                           f"prompt {prompt[:80]!r}...); OpenRLHF sends query = prompt + response")

    def split(self, query: str, prompt: str, label: str) -> Sample:
        return Sample(prompt, self.question_of(prompt), label, self.completion_of(prompt, query))


# A truncated prompt is recognised by a shared tail of at least this many characters (or the template's suffix,
# if longer), after at most _CUT_TOKEN_CHARS characters of a token cut in the middle of a character.
_MIN_TRUNCATED_OVERLAP = 16
_CUT_TOKEN_CHARS = 4


def _longest_prefix_that_ends(head: str, text: str) -> int:
    """The length of the longest prefix of `head` that is a suffix of `text`, in time linear in their lengths.

    Every candidate length k is tested at once by polynomial hashes (mod the prime 2^31 - 1) of head's prefixes and
    text's suffixes, as numpy array operations (C speed: a pure-Python failure function took ~1 s on a 1 M-character
    prompt). Hash equality only nominates a length; each is confirmed by comparing the strings, longest first, so a
    collision costs a comparison, never a wrong answer."""
    m = min(len(head), len(text))
    if m == 0:
        return 0
    head, tail = head[:m], text[len(text) - m:]
    a, b = _code_points(head), _code_points(tail)
    powers = _powers(m)
    # prefix sums of a_j p^j and b_t p^t: each term < 2^52, each mod M < 2^31, a sum of m terms < 2^63 for m < 2^32
    head_hash = np.concatenate(([0], np.cumsum(a * powers % _MOD) % _MOD))
    tail_sums = np.concatenate(([0], np.cumsum(b * powers % _MOD) % _MOD))
    # head[:k] == tail[m-k:]  <=>  hash(head[:k]) p^(m-k) == sum over t in [m-k, m) of b_t p^t   (mod M)
    # as arrays over k = 1..m: hash(head[:k]) is head_hash[1:], p^(m-k) is powers reversed, tail_sums[m-k] too
    left = head_hash[1:] * powers[::-1] % _MOD
    right = (tail_sums[m] - tail_sums[m - 1::-1]) % _MOD
    for k in np.flatnonzero(left == right)[::-1] + 1:
        if tail.endswith(head[:k]):
            return int(k)
    return 0


_MOD = (1 << 31) - 1  # a prime: products of two residues fit in int64
_BASE = 1_000_003  # above every code point (< 2^21), so distinct short strings hash apart


def _code_points(text: str) -> np.ndarray:
    """The code points of `text` as int64 (a lone surrogate, which validation refuses upstream, included)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.int64)


def _powers(count: int) -> np.ndarray:
    """_BASE^j mod _MOD for j < count, by doubling (log2(count) array operations)."""
    powers = np.ones(count, dtype=np.int64)
    filled, factor = 1, _BASE
    while filled < count:
        step = min(filled, count - filled)
        powers[filled: filled + step] = powers[:step] * factor % _MOD
        filled, factor = filled + step, factor * factor % _MOD
    return powers
