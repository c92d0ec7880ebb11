"""The service's memory bound on work in flight: samples and request bytes admitted and not yet answered.

A request that finds the scorer busy waits its turn (`serve/batcher.py`): OpenRLHF's client counts any non-2xx as a
failed try and crashes the run after five, so refusing load a trainer really sends is never right. What is
refused is only what no trainer's step reaches and what would otherwise grow memory without end: past
`max_samples` samples or `max_bytes` request-body bytes in flight, a new request is refused at once with a
`Retry-After` (503); the ones already admitted are answered. Defaults (`cli.serve`): 65,536 samples (4x a rollout
batch of 1,024 prompts x 16 samples, each its own request) and 1 GiB of bodies (64 KiB a sample at 16,384
samples, more than a 16k-token response with its prompt). A request's bytes count from its first chunk
on, as its body arrives. Pure bookkeeping on the event loop: no locks.
"""

import math
from contextlib import contextmanager


class Overloaded(RuntimeError):
    """Admitting a request would pass the memory bound; `retry_after_s` is when to try again."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Admission:
    """Counts the samples and bytes of the requests in flight; a `Ticket` holds one request's share.

    A request's bytes are counted as its body arrives (`Ticket.add` per chunk), not once it has all arrived: many
    large bodies being uploaded at once are memory too, and one past the bound is refused before it is read."""

    def __init__(self, max_samples: int, max_bytes: int):
        if max_samples < 1 or max_bytes < 1:
            raise ValueError(f"need max_samples >= 1 and max_bytes >= 1; got {max_samples}, {max_bytes}")
        self.max_samples, self.max_bytes = max_samples, max_bytes
        self.samples = 0
        self.bytes = 0
        self.refused = 0

    @contextmanager
    def ticket(self, samples_per_second: float = 0.0):
        """A `Ticket` for one request, whose whole share is given back when the block ends (answered or not).

        samples_per_second: the recent scoring rate, to say in Retry-After when the backlog will have drained."""
        held = Ticket(self, samples_per_second)
        try:
            yield held
        finally:
            self.samples -= held.samples
            self.bytes -= held.bytes

    @contextmanager
    def admit(self, samples: int, body_bytes: int, samples_per_second: float = 0.0):
        """Hold a request's whole share at once while it is served; Overloaded if it does not fit."""
        with self.ticket(samples_per_second) as held:
            held.add(samples, body_bytes)
            yield


class Ticket:
    """One request's share of the bound, grown as its body arrives and once its samples are known."""

    def __init__(self, admission: Admission, samples_per_second: float):
        self.admission, self.samples_per_second = admission, samples_per_second
        self.samples = 0
        self.bytes = 0

    def add(self, samples: int = 0, body_bytes: int = 0) -> None:
        """Hold `samples` and `body_bytes` more; Overloaded (and nothing more held) if they do not fit."""
        a = self.admission
        if a.samples + samples > a.max_samples or a.bytes + body_bytes > a.max_bytes:
            a.refused += 1
            drain_s = a.samples / self.samples_per_second if self.samples_per_second > 0 else 1.0
            raise Overloaded(f"{a.samples} samples ({a.bytes} bytes) in flight; the bound is {a.max_samples} samples "
                             f"(--max-queued-samples) and {a.max_bytes} bytes (--max-queued-bytes)",
                             retry_after_s=max(1, min(60, math.ceil(drain_s))))
        a.samples += samples
        a.bytes += body_bytes
        self.samples += samples
        self.bytes += body_bytes
