"""What the reward service reports: per-step metrics to JSONL and tensorboard, live numbers at /metrics.

`ServiceLog.step` writes one JSON line per step (`{out}/metrics.jsonl`, flushed: a crash keeps what was written)
and the same scalars to tensorboard (`{out}/tensorboard`), under the trainer's own keys (`cooper/*`), so the
package's report and hacking replay read a service run as they read a training run. `/metrics` is Prometheus'
text format (`prometheus_client`): request counters and latencies by route and status, and the service's gauges
(RM version, queues, groups, updates, the last step's metrics). `{out}/run_info.json` names the run (arm
"reward-service"), so `python -m cooper_openrlhf.cli.report STATE_DIR/logs` draws a service run's figures.
"""

import json
import math
import os
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the app)

from cooper_openrlhf.serve.published_names import STEP_LOG_KEY, STEP_METRICS_GAUGE

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def prometheus_name(key: str) -> str:
    """A metric key as a Prometheus name: `cooper/rm_loss` -> `cooper_rm_loss`."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in key)


class ServiceLog:
    def __init__(self, out_dir: str | None, tensorboard: bool = True, arm: str = "reward-service"):
        self.registry = CollectorRegistry()
        self.requests = Counter("cooper_serve_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=self.registry)
        self.samples = Counter("cooper_serve_samples", "samples scored", registry=self.registry)
        self.latency = Histogram("cooper_serve_request_seconds", "request latency", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.gauge = Gauge("cooper_serve", "service state", ["name"], registry=self.registry)
        self.step_gauge = Gauge(STEP_METRICS_GAUGE, "the last step's metrics", ["key"], registry=self.registry)
        self._jsonl = self._writer = None
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, "run_info.json"), "w", encoding="utf-8") as handle:
                json.dump({"arm": arm, "seed": 0}, handle)
            self._jsonl = open(os.path.join(out_dir, "metrics.jsonl"), "a", encoding="utf-8")
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(os.path.join(out_dir, "tensorboard"))

    def step(self, index: int, metrics: dict[str, float]) -> None:
        finite = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        for key, value in finite.items():
            self.step_gauge.labels(key=prometheus_name(key)).set(value)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({STEP_LOG_KEY: index, "time": time.time(), **finite}) + "\n")
            self._jsonl.flush()
        if self._writer is not None:
            for key, value in finite.items():
                self._writer.add_scalar(key, value, index)
            self._writer.flush()

    def exposition(self, gauges: dict[str, float]) -> bytes:
        """The Prometheus text of every metric, with `gauges` (the service's live numbers) set first."""
        for name, value in gauges.items():
            self.gauge.labels(name=name).set(value)
        return generate_latest(self.registry)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
