"""Optional OpenTelemetry traces: one span per request, exported over OTLP/HTTP.

Imported only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is
set; needs the ``otel`` extra (``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-http``).
The exporter reads the standard ``OTEL_*`` variables (endpoint, headers, timeout); the service name
defaults to ``djl-handlers`` (``OTEL_SERVICE_NAME`` overrides it). A ``traceparent`` request header
makes the span a child of the caller's trace.

The span is built when the request finishes, from the timestamps the server already took, so an
enabled tracer adds nothing to the step loop: span ``djl_handlers.request`` from arrival to the
response's end, events ``queued`` (arrival), ``prefill`` (joined a batch), ``decode`` (first token),
attributes ``djl_handlers.request_id``, ``http.response.status_code``, ``gen_ai.usage.input_tokens``,
``gen_ai.usage.output_tokens``, ``gen_ai.response.finish_reasons``, ``djl_handlers.adapter``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

__all__ = ["SpanRecorder", "from_env"]

_LOG = logging.getLogger("djl_handlers.server")


class SpanRecorder:
    """Turns finished :class:`.telemetry.RequestTrace` records into spans of one tracer provider."""

    def __init__(self, provider: Any) -> None:
        """``provider``: an ``opentelemetry.sdk.trace.TracerProvider`` with its span processors."""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("djl_handlers.server")
        self._propagator = TraceContextTextMapPropagator()
        # monotonic seconds -> epoch nanoseconds (spans carry wall-clock times)
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    def _ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self._offset_ns

    def record(self, trace: Any, end: float, status: int, reason: str, prompt_tokens: Any, generated: Any) -> None:
        """Export one request's span."""
        context = None
        if trace.traceparent:
            context = self._propagator.extract({"traceparent": trace.traceparent})
        attributes: dict[str, Any] = {
            "djl_handlers.request_id": trace.request_id,
            "http.response.status_code": status,
            "gen_ai.response.finish_reasons": [reason],
        }
        if trace.adapter:
            attributes["djl_handlers.adapter"] = trace.adapter
        if isinstance(prompt_tokens, int):
            attributes["gen_ai.usage.input_tokens"] = prompt_tokens
        if isinstance(generated, int):
            attributes["gen_ai.usage.output_tokens"] = generated
        span = self.tracer.start_span("djl_handlers.request", context=context, attributes=attributes,
                                      start_time=self._ns(trace.created))
        span.add_event("queued", timestamp=self._ns(trace.created))
        if trace.admitted is not None:
            span.add_event("prefill", timestamp=self._ns(trace.admitted))
        if trace.first_token is not None:
            span.add_event("decode", timestamp=self._ns(trace.first_token))
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        span.end(end_time=self._ns(end))

    def shutdown(self) -> None:
        """Flush pending spans and stop the exporter."""
        self.provider.shutdown()


def from_env() -> SpanRecorder | None:
    """A recorder exporting over OTLP/HTTP as the ``OTEL_*`` variables say; None (with a warning)
    when the ``otel`` extra is not installed."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        _LOG.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed: "
                     "pip install 'djl_handlers[otel]'; tracing is off")
        return None
    import os

    name = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "djl-handlers"}
    provider = TracerProvider(resource=Resource.create(name))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _LOG.info("OpenTelemetry: exporting one span per request over OTLP/HTTP")
    return SpanRecorder(provider)
