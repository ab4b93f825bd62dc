"""Prometheus text exposition for the local server (``GET /metrics``), no client library needed.

Series (all prefixed ``djl_handlers_``): ``requests_total{code}``, ``request_duration_seconds``
(histogram), ``queue_depth``, ``in_flight``, ``rolling_batch_size``, ``generated_tokens_total``,
``cancelled_total``, ``worker_restarts_total``, ``worker_up``. Updated only on the event loop.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["BUCKETS", "Metrics"]

BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass
class Metrics:
    """Counters and gauges; :meth:`render` produces the text format."""

    model: str = "model"
    requests: Counter[int] = field(default_factory=Counter)
    bucket_counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    duration_sum: float = 0.0
    duration_count: int = 0
    tokens: int = 0
    cancelled: int = 0
    restarts: int = 0
    rolling_batch_size: int = 0

    def observe(self, code: int, seconds: float) -> None:
        """Count one finished request with its HTTP status and latency."""
        self.requests[code] += 1
        self.duration_sum += seconds
        self.duration_count += 1
        for index, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.bucket_counts[index] += 1

    def render(self, queue_depth: int, in_flight: int, worker_up: bool) -> str:
        """The Prometheus text exposition (version 0.0.4)."""
        label = f'model="{self.model}"'
        lines = [
            "# HELP djl_handlers_requests_total Finished HTTP inference requests by status code.",
            "# TYPE djl_handlers_requests_total counter",
        ]
        for code in sorted(self.requests):
            lines.append(f'djl_handlers_requests_total{{{label},code="{code}"}} {self.requests[code]}')
        lines += [
            "# HELP djl_handlers_request_duration_seconds Time from arrival to the last byte queued.",
            "# TYPE djl_handlers_request_duration_seconds histogram",
        ]
        for bound, count in zip(BUCKETS, self.bucket_counts, strict=True):
            lines.append(f'djl_handlers_request_duration_seconds_bucket{{{label},le="{bound}"}} {count}')
        lines.append(f'djl_handlers_request_duration_seconds_bucket{{{label},le="+Inf"}} {self.duration_count}')
        lines.append(f"djl_handlers_request_duration_seconds_sum{{{label}}} {self.duration_sum:.6f}")
        lines.append(f"djl_handlers_request_duration_seconds_count{{{label}}} {self.duration_count}")
        gauges = [
            ("queue_depth", "gauge", "Requests waiting for a batch slot.", queue_depth),
            ("in_flight", "gauge", "Requests being served by the worker.", in_flight),
            ("rolling_batch_size", "gauge", "Requests in the last rolling-batch step.", self.rolling_batch_size),
            ("generated_tokens_total", "counter", "Tokens streamed (rolling-batch records with data).",
             self.tokens),
            ("cancelled_total", "counter", "Requests whose client went away.", self.cancelled),
            ("worker_restarts_total", "counter", "Worker processes restarted after dying.", self.restarts),
            ("worker_up", "gauge", "1 when the worker process is alive and initialized.", int(worker_up)),
        ]
        for name, kind, help_text, value in gauges:
            lines += [f"# HELP djl_handlers_{name} {help_text}", f"# TYPE djl_handlers_{name} {kind}",
                      f"djl_handlers_{name}{{{label}}} {value}"]
        return "\n".join(lines) + "\n"
