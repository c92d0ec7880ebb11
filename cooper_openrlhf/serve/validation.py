"""Each sample's texts checked before they join a batch, so that a bad one is its own request's 400.

A text joins a batch with up to `--max-batch` others, and a text the tokenizer cannot take fails the whole batch
(the batcher then scores the batch's members apart, `serve/batcher.py`, but that costs the others time). Two
things are checked per field of every sample, naming the sample and the field:
- it is text a tokenizer can encode: JSON allows a lone UTF-16 surrogate (`"\\ud800"`), `json.loads` gives it
  back as a Python string, and the fast tokenizer raises on it;
- it is at most `max_chars` characters (`--max-sample-chars`): the RM's template never cuts the question, so an
  unbounded prompt is an unbounded tokenization on the scoring thread.
Pure: strings in, a RequestError or nothing out.
"""

from collections.abc import Sequence

from cooper_openrlhf.serve.protocol import RequestError

DEFAULT_MAX_SAMPLE_CHARS = 1 << 20  # 1 Mi characters, about 256k tokens: beyond any prompt + response a trainer makes


def check_sample_texts(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[str],
                       max_chars: int = DEFAULT_MAX_SAMPLE_CHARS) -> None:
    """RequestError(400) naming the first sample and field that is not encodable text or is over `max_chars`."""
    for i, fields in enumerate(zip(queries, prompts, labels)):
        for name, text in zip(("query", "prompts", "labels"), fields):
            if len(text) > max_chars:
                raise RequestError(f"sample {i}: field {name!r} has {len(text)} characters; at most {max_chars} "
                                   f"(--max-sample-chars)")
            if text.isascii():  # O(1) in CPython (a flag of the string): the common case needs no encoding
                continue
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RequestError(f"sample {i}: field {name!r} is not valid Unicode text ({exc.reason}: "
                                   f"{text[exc.start:exc.end]!r} at character {exc.start}); no tokenizer can encode "
                                   f"it") from None
