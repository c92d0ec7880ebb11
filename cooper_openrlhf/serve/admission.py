"""The service's memory bound on work in flight: samples and request bytes admitted and not yet answered.

A request that finds the scorer busy waits its turn (`serve/batcher.py`): OpenRLHF's client counts any non-2xx as a
failed try and crashes the run after five, so refusing load a trainer really sends is never right. What is
refused is only what no trainer's step reaches and what would otherwise grow memory without end: past
`max_samples` samples or `max_bytes` request-body bytes in flight, a new request is refused at once with a
`Retry-After` (503); the ones already admitted are answered. Defaults (`cli.serve`): 65,536 samples (4x a rollout
batch of 1,024 prompts x 16 samples, each its own request) and 1 GiB of bodies (64 KiB a sample at 16,384
samples, more than a 16k-token response with its prompt). Pure bookkeeping on the event loop: no locks.
"""

import math
from contextlib import contextmanager


class Overloaded(RuntimeError):
    """Admitting a request would pass the memory bound; `retry_after_s` is when to try again."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Admission:
    """Counts the samples and bytes of the requests in flight; `admit` refuses past either bound."""

    def __init__(self, max_samples: int, max_bytes: int):
        if max_samples < 1 or max_bytes < 1:
            raise ValueError(f"need max_samples >= 1 and max_bytes >= 1; got {max_samples}, {max_bytes}")
        self.max_samples, self.max_bytes = max_samples, max_bytes
        self.samples = 0
        self.bytes = 0
        self.refused = 0

    @contextmanager
    def admit(self, samples: int, body_bytes: int, samples_per_second: float = 0.0):
        """Hold the request's share while it is served; Overloaded if it does not fit.

        samples_per_second: the recent scoring rate, to say in Retry-After when the backlog will have drained."""
        if self.samples + samples > self.max_samples or self.bytes + body_bytes > self.max_bytes:
            self.refused += 1
            drain_s = self.samples / samples_per_second if samples_per_second > 0 else 1.0
            raise Overloaded(f"{self.samples} samples ({self.bytes} bytes) in flight; the bound is "
                             f"{self.max_samples} samples (--max-queued-samples) and {self.max_bytes} bytes "
                             f"(--max-queued-bytes)", retry_after_s=max(1, min(60, math.ceil(drain_s))))
        self.samples += samples
        self.bytes += body_bytes
        try:
            yield
        finally:
            self.samples -= samples
            self.bytes -= body_bytes
