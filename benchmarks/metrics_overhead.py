"""What the observability code costs per rolling-batch step, in µs, for the overhead benchmark.

Timed on a real step of the overhead run (its captured reply, 16 records):

- ``metrics: server, per step``: ``Telemetry.rolling_step`` on the step's decoded records, as the
  server runs it after every step (TTFT/ITL timestamps, one histogram observation per token,
  the engine-stats property when present);
- ``metrics: server, per request (amortised)``: ``start`` + ``admitted`` + ``finish`` (every
  histogram, the counters, the INFO log line written to a buffer), spread over the request's steps;
- ``metrics: worker engine stats (amortised)``: ``InferenceService._add_engine_stats`` (KV bytes from
  the slab, JSON) as called every step, i.e. computed every 16th;
- ``metrics: worker last-record stats (amortised)``: ``RequestSlot.stats`` once per request.

``step_token_num`` in each record is inside the "handler glue + records" layer already.
"""

from __future__ import annotations

import io
import logging
import time
from types import SimpleNamespace
from typing import Any

__all__ = ["metrics_layers"]


def _per_call_us(fn: Any, repeat: int) -> float:
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat * 1e6


def _records(output: Any) -> tuple[list[Any], dict[str, str]]:
    from djl_handlers.protocol.rolling import decode_record

    content = output.content
    records = [decode_record(bytes(content.value_at(i))) for i in range(content.size())]
    properties = output.get_properties() if hasattr(output, "get_properties") else dict(output.properties)
    return records, {str(k): str(v) for k, v in properties.items()}


def metrics_layers(service: Any, output: Any, steps_per_request: int, repeat: int = 200) -> dict[str, float]:
    """µs per step of each observability cost (see the module docstring)."""
    from djl_handlers.extensions import ENGINE_STATS_EVERY_STEPS, ENGINE_STATS_PROPERTY
    from djl_handlers.server.telemetry import REQUEST_LOG, Telemetry

    records, properties = _records(output)
    batch = len(records)
    telemetry = Telemetry("bench", running=lambda: batch, waiting=lambda: 0, worker_up=lambda: 1)
    body = [("data", b'{"inputs": "x", "parameters": {}}')]
    owners = [SimpleNamespace(trace=telemetry.start({"requestId": f"r{i}"}, body)) for i in range(batch)]
    for owner in owners:
        telemetry.admitted(owner.trace)
    results = [(SimpleNamespace(owner=owner), record, {}) for owner, record in zip(owners, records, strict=True)]
    properties.setdefault(ENGINE_STATS_PROPERTY, '{"batch_size":16,"kv_cache_usage":0.5}')
    server_step = _per_call_us(lambda: telemetry.rolling_step(results, properties, batch), repeat)

    handler = logging.StreamHandler(io.StringIO())
    REQUEST_LOG.addHandler(handler)
    level, propagate = REQUEST_LOG.level, REQUEST_LOG.propagate
    REQUEST_LOG.setLevel(logging.INFO)
    REQUEST_LOG.propagate = False
    stats = '{"prompt_tokens":64,"generated_tokens":50,"finish_reason":"length"}'

    def one_request() -> None:
        trace = telemetry.start({"requestId": "r"}, body)
        telemetry.admitted(trace)
        trace.on_tokens(time.monotonic(), 1)
        trace.stats = stats
        telemetry.finish(trace, 200, cancelled=False)

    try:
        server_request = _per_call_us(one_request, repeat)
    finally:
        REQUEST_LOG.removeHandler(handler)
        REQUEST_LOG.setLevel(level)
        REQUEST_LOG.propagate = propagate

    class _Out:
        def add_property(self, key: str, value: str) -> None:
            pass

    sink = _Out()
    engine_stats = _per_call_us(lambda: service._add_engine_stats(sink, batch), ENGINE_STATS_EVERY_STEPS * 20)
    slot = service.rolling.slots[0] if service.rolling is not None and service.rolling.slots else None
    slot_stats = _per_call_us(slot.stats, repeat) if slot is not None else 0.0
    return {
        "metrics: server, per step": server_step,
        "metrics: server, per request (amortised)": server_request * batch / steps_per_request,
        "metrics: worker engine stats (amortised)": engine_stats,
        "metrics: worker last-record stats (amortised)": slot_stats * batch / steps_per_request,
    }
