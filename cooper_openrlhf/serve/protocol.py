"""The reward service's wire protocol: OpenRLHF's remote-RM request in, its response out; pure functions.

OpenRLHF 0.11.2 (`openrlhf/utils/agent.py`, `SingleTurnAgentExecutor._fetch_rewards_via_http`) POSTs one finished
sample per request::

    {"query": [prompt + response, decoded with special tokens], "prompts": [the templated prompt], "labels": [label]}

and reads ``{"rewards": [...], "scores": [...], "extra_logs": {name: [...]}}``, one value per query (each
extra_logs value becomes a per-sample `info[name]` tensor it logs). A request may carry several samples (the TRL
and verl clients send a batch); every list must then have one entry per query.

What the RM reads is (raw question, reference = the label, completion): `PromptSplitter` recovers them. The
prompt is the policy's chat template applied to the question (OpenRLHF's `--data.apply_chat_template`), or the
question through `--data.input_template`, or the question itself; the splitter renders a sentinel question
through the same template once, so it knows the text around the question, and checks each recovery by rendering
the question back. The completion is the query after the prompt, with the policy's special tokens removed (as
the trainer's own decode with `skip_special_tokens=True` gives it).
"""

from collections.abc import Sequence
from dataclasses import dataclass

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
    """Recovers (question, completion) from OpenRLHF's (prompt, query) for one prompt format.

    chat_template: a callable question -> templated prompt (the policy tokenizer's `apply_chat_template` with a
        generation prompt, as OpenRLHF's `preprocess_data`), or None when prompts are not chat-templated.
    input_template: OpenRLHF's `--data.input_template` ("...{}..."), applied to the question before the chat
        template, or None.
    special_tokens: the policy tokenizer's special-token strings, removed from the completion.
    """

    def __init__(self, chat_template=None, input_template: str | None = None, special_tokens: Sequence[str] = ()):
        if input_template is not None and input_template.count("{}") != 1:
            raise ValueError(f"input_template must hold exactly one '{{}}', got {input_template!r}")
        self._chat = chat_template
        self._input_template = input_template
        self._special = sorted((t for t in special_tokens if t), key=len, reverse=True)
        rendered = self.render(_SENTINEL)
        if rendered.count(_SENTINEL) != 1:
            raise ValueError("the prompt template does not place the question exactly once; cannot split prompts")
        self._prefix, self._suffix = rendered.split(_SENTINEL)

    @classmethod
    def from_tokenizer(cls, tokenizer, apply_chat_template: bool = True, input_template: str | None = None):
        """The splitter of a policy whose prompts OpenRLHF built with this tokenizer (`preprocess_data`)."""
        chat = None
        if apply_chat_template:
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError("the policy tokenizer has no chat template; pass --no-chat-template if prompts are "
                                 "the questions themselves")

            def chat(text: str) -> str:
                return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                     add_generation_prompt=True)
        return cls(chat, input_template, tokenizer.all_special_tokens)

    def render(self, question: str) -> str:
        """The prompt OpenRLHF builds from `question`."""
        text = self._input_template.replace("{}", question) if self._input_template else question
        return self._chat(text) if self._chat else text

    def question_of(self, prompt: str) -> str:
        """The raw question inside `prompt`; a RequestError when the prompt is not of this format."""
        if not (prompt.startswith(self._prefix) and prompt.endswith(self._suffix)
                and len(prompt) >= len(self._prefix) + len(self._suffix)):
            raise RequestError(f"prompt does not match the policy's prompt template (expected it to start with "
                               f"{self._prefix[-60:]!r} and end with {self._suffix[:60]!r}): {prompt[:120]!r}")
        question = prompt[len(self._prefix): len(prompt) - len(self._suffix)]
        if self.render(question) != prompt:
            raise RequestError(f"the recovered question does not render back to the prompt: {prompt[:120]!r}")
        return question

    def completion_of(self, prompt: str, query: str) -> str:
        """The response text of `query` (= prompt + response), special tokens removed."""
        if not query.startswith(prompt):
            raise RequestError(f"query does not start with its prompt (query {query[:80]!r}..., prompt "
                               f"{prompt[:80]!r}...); OpenRLHF sends query = prompt + response")
        completion = query[len(prompt):]
        for token in self._special:
            completion = completion.replace(token, "")
        return completion

    def split(self, query: str, prompt: str, label: str) -> Sample:
        return Sample(prompt, self.question_of(prompt), label, self.completion_of(prompt, query))
