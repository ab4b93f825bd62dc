"""Per-request telemetry of the local server: timestamps -> metrics, log line and trace span.

Where each figure is measured (the server and the worker are separate processes):

* server clock (``time.monotonic``, event-loop thread): arrival (the sink's creation), admission
  (the request joins a rolling batch or a dynamic batch is sent), every rolling-batch step reply
  (its records carry DJL's ``step_token_num``: the tokens the step added for that request), every
  streamed chunk in dynamic-batch mode, the response's end. TTFT, inter-token latency, queue,
  prefill, decode and end-to-end times come from these.
* worker: prompt tokens, generated tokens and finish reason arrive once, in the last record
  (``STATS_RECORD_KEY``); KV-cache use and the engine's batch size arrive as a step-reply property
  (``ENGINE_STATS_PROPERTY``) on the first step, every 16 steps and when the batch empties.

The per-step cost is one loop over the step's records (a counter and, per token, a histogram
observation); everything else happens once per request, when it finishes.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from djl_handlers.extensions import API_PROPERTY, ENGINE_STATS_PROPERTY, REQUEST_ID_PROPERTY
from djl_handlers.server.metrics import DEFAULT_MAX_TOKENS, Metrics, RequestSeries

__all__ = ["REQUEST_LOG", "RequestTrace", "Telemetry"]

REQUEST_LOG = logging.getLogger("djl_handlers.server.requests")
_LOG = logging.getLogger("djl_handlers.server")
_PROMPT_LOG_LIMIT = 4096


@dataclass(eq=False)
class RequestTrace:
    """One request's timestamps (monotonic seconds) and what the worker reported about it."""

    request_id: str
    series: RequestSeries
    created: float
    adapter: str = ""
    api: str = ""
    admitted: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    counted: bool = False  # ``tokens`` are real token counts (rolling batch), not chunks
    stats: str | None = None
    body: bytes | None = None  # kept only with --log-prompts
    traceparent: str | None = None

    def on_tokens(self, now: float, count: int, counted: bool = True) -> None:
        """``count`` tokens arrived at ``now``: the first sets TTFT, later ones the inter-token gaps."""
        last = self.last_token
        if last is None:
            self.first_token = now
        else:
            gap = (now - last) / count
            observe = self.series.itl.observe
            for _ in range(count):
                observe(gap)
        self.last_token = now
        self.tokens += count
        self.counted = counted


def _property(properties: dict[str, str], name: str) -> str | None:
    lowered = name.lower()
    for key, value in properties.items():
        if key.lower() == lowered:
            return value
    return None


class Telemetry:
    """The hooks the runtime calls; owns the metrics, the request log and the optional tracer."""

    def __init__(self, model: str, *, running: Callable[[], float] = lambda: 0,
                 waiting: Callable[[], float] = lambda: 0, worker_up: Callable[[], float] = lambda: 0,
                 max_model_len: str | int | None = None, log_prompts: bool = False, tracer: Any = None) -> None:
        """``max_model_len`` bounds the token histograms' buckets; ``tracer`` defaults to
        :func:`.tracing.from_env` (None unless OTLP is configured)."""
        try:
            max_tokens = int(max_model_len or DEFAULT_MAX_TOKENS)
        except ValueError:
            max_tokens = DEFAULT_MAX_TOKENS
        self.metrics = Metrics(model, running=running, waiting=waiting, worker_up=worker_up,
                               max_tokens=max_tokens)
        self.log_prompts = log_prompts
        if tracer is None and (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                               or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
            from djl_handlers.server.tracing import from_env

            tracer = from_env()
        self.tracer = tracer

    # ------------------------------------------------------------------ request life

    def start(self, properties: dict[str, str], content: Iterable[tuple[str | None, bytes]]) -> RequestTrace:
        """A request was accepted into the queue."""
        adapter = _property(properties, "adapter")
        body = None
        for key, value in content:
            if key == "adapter" and adapter is None:
                adapter = value.decode("utf-8", "replace")
            elif key == "data" and self.log_prompts:
                body = value
        series = self.metrics.series(adapter or "")
        return RequestTrace(
            request_id=properties.get(REQUEST_ID_PROPERTY) or "-", series=series,
            created=time.monotonic(), adapter=series.adapter, api=_property(properties, API_PROPERTY) or "",
            body=body, traceparent=_property(properties, "traceparent") if self.tracer else None,
        )

    @staticmethod
    def admitted(trace: RequestTrace | None) -> None:
        """The request left the queue for the worker."""
        if trace is not None and trace.admitted is None:
            trace.admitted = time.monotonic()

    def rolling_step(self, results: Iterable[tuple[Any, Any, Any]], properties: dict[str, str],
                     batch_size: int) -> None:
        """One rolling-batch step reply: ``(slot, record, headers)`` per request, the frame's properties.
        Never raises: a telemetry fault must not stop the step loop."""
        try:
            self._rolling_step(results, properties, batch_size)
        except Exception:  # noqa: BLE001
            _LOG.exception("telemetry: a rolling step could not be recorded")

    def _rolling_step(self, results: Iterable[tuple[Any, Any, Any]], properties: dict[str, str],
                      batch_size: int) -> None:
        now = time.monotonic()
        self.metrics.rolling_batch_size = batch_size
        for slot, record, _ in results:
            trace: RequestTrace | None = getattr(slot.owner, "trace", None)
            if trace is None:
                continue
            if record.tokens > 0 and record.code is None:
                trace.on_tokens(now, record.tokens)
            if record.stats is not None:
                trace.stats = record.stats
        raw = properties.get(ENGINE_STATS_PROPERTY)
        if raw:
            try:
                stats = json.loads(raw)
            except ValueError:
                return
            if isinstance(stats, dict):
                self.metrics.engine_stats(stats)

    @staticmethod
    def chunk(trace: RequestTrace | None) -> None:
        """A streamed chunk of a dynamic-batch reply arrived (one chunk counted as one token)."""
        if trace is not None:
            trace.on_tokens(time.monotonic(), 1, counted=False)

    def finish(self, trace: RequestTrace | None, status: int, cancelled: bool) -> None:
        """The response ended (sent, failed or cancelled): observe, log, export the span. Never raises."""
        if trace is None:
            return
        try:
            self._finish(trace, status, cancelled)
        except Exception:  # noqa: BLE001
            _LOG.exception("telemetry: RequestId=[%s] could not be recorded", trace.request_id)

    def _finish(self, trace: RequestTrace, status: int, cancelled: bool) -> None:
        end = time.monotonic()
        stats = _stats(trace.stats)
        reason = "cancelled" if cancelled else "error" if status >= 400 else str(stats.get("finish_reason") or "")
        reason = reason or "unknown"  # dynamic batch: the worker reports no finish reason
        prompt_tokens = stats.get("prompt_tokens")
        generated = stats.get("generated_tokens", trace.tokens if trace.counted else None)
        s = trace.series
        s.e2e.observe(end - trace.created)
        if trace.admitted is not None:
            s.queue.observe(trace.admitted - trace.created)
        if trace.first_token is not None and trace.last_token is not None:
            s.ttft.observe(trace.first_token - trace.created)
            if trace.admitted is not None:
                s.prefill.observe(trace.first_token - trace.admitted)
            decode = trace.last_token - trace.first_token
            s.decode.observe(decode)
            if trace.tokens > 1:
                s.tpot.observe(decode / (trace.tokens - 1))
        answered = status < 400  # per-request token histograms: answered requests; counters: all work done
        if isinstance(prompt_tokens, int):
            if answered:
                s.prompt_tokens.observe(prompt_tokens)
            s.prompt_total.inc(prompt_tokens)
        if isinstance(generated, int):
            if answered:
                s.generation_tokens.observe(generated)
            s.generation_total.inc(generated)
        metrics = self.metrics
        if "kind" in stats:  # an embedding or reranking model's request (djl_handlers.pooling)
            metrics.pooling(stats)
        metrics.finished.labels(metrics.model, trace.adapter, reason).inc()
        metrics.requests.labels(metrics.model, str(status)).inc()
        self._log(trace, end, status, reason, prompt_tokens, generated)
        if self.tracer is not None:
            self.tracer.record(trace, end, status, reason, prompt_tokens, generated)

    def _log(self, trace: RequestTrace, end: float, status: int, reason: str, prompt_tokens: Any,
             generated: Any) -> None:
        if not REQUEST_LOG.isEnabledFor(logging.INFO):
            return
        ttft = None if trace.first_token is None else round((trace.first_token - trace.created) * 1000, 3)
        fields: dict[str, Any] = {
            "request_id": trace.request_id, "status": status, "prompt_tokens": prompt_tokens,
            "generated_tokens": generated, "ttft_ms": ttft, "total_ms": round((end - trace.created) * 1000, 3),
            "finish_reason": reason,
        }
        if trace.adapter:
            fields["adapter"] = trace.adapter
        if trace.api:
            fields["api"] = trace.api
        if self.log_prompts and trace.body is not None:
            fields["prompt"] = _prompt_text(trace.body)
        text = " ".join(f"{key}={value}" for key, value in fields.items() if key != "request_id")
        REQUEST_LOG.info("RequestId=[%s] finished: %s", trace.request_id, text,
                         extra={"request_id": trace.request_id, "fields": fields})

    def close(self) -> None:
        """Flush and stop the tracer, if any."""
        if self.tracer is not None:
            self.tracer.shutdown()


def _stats(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _prompt_text(body: bytes) -> str:
    """The prompt part of a request body (``inputs``/``prompt``/``messages``), else the body, truncated."""
    text = body.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key in ("inputs", "prompt", "messages"):
            if key in parsed:
                value = parsed[key]
                text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                break
    return text[:_PROMPT_LOG_LIMIT]
