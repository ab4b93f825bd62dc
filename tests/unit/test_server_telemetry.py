"""Server telemetry without a server: metrics from a request's timestamps (on a fake clock), the
exposition formats, request ids, JSON log lines, the worker's stats record, OpenTelemetry spans."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from djl_handlers.extensions import ENGINE_STATS_PROPERTY, REQUEST_ID_PROPERTY, STATS_RECORD_KEY
from djl_handlers.protocol.rolling import Record, decode_record
from djl_handlers.server import telemetry as telemetry_module
from djl_handlers.server.logs import JsonFormatter
from djl_handlers.server.metrics import Metrics, token_buckets
from djl_handlers.server.request_id import request_id_of
from djl_handlers.server.telemetry import Telemetry


class Clock:
    """A settable ``time.monotonic``."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(telemetry_module.time, "monotonic", fake)
    return fake


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value("djl_handlers_" + name, {"model": "m", **labels})
    return 0.0 if value is None else value


def _step(tel: Telemetry, owner: Any, record: Record, props: dict[str, str] | None = None) -> None:
    tel.rolling_step([(SimpleNamespace(owner=owner), record, {})], props or {}, 1)


def test_token_buckets_follow_vllms_1_2_5_series() -> None:
    assert token_buckets(100) == (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
    assert token_buckets(4096)[-1] == 2000.0


def test_one_rolling_request_gives_exact_figures(clock: Clock) -> None:
    tel = Telemetry("m", tracer=None)
    trace = tel.start({REQUEST_ID_PROPERTY: "r1", "Adapter": "fr"}, [("data", b"{}")])
    owner = SimpleNamespace(trace=trace)
    clock.now += 0.25
    tel.admitted(trace)
    clock.now += 0.5  # prefill
    _step(tel, owner, Record(data="a", tokens=1))
    for gap in (0.1, 0.3):
        clock.now += gap
        _step(tel, owner, Record(data="b", tokens=1))
    clock.now += 0.2  # a step that produced nothing for this request (e.g. its neighbour's prefill)
    _step(tel, owner, Record(data="", tokens=0))
    clock.now += 0.2
    stats = json.dumps({"prompt_tokens": 7, "generated_tokens": 4, "finish_reason": "length"})
    _step(tel, owner, Record(data="c", last=True, tokens=1, stats=stats))
    clock.now += 0.05
    tel.finish(trace, 200, cancelled=False)
    m, fr = tel.metrics, {"adapter": "fr"}
    assert sample(m, "time_to_first_token_seconds_sum", **fr) == pytest.approx(0.75)
    assert sample(m, "request_queue_time_seconds_sum", **fr) == pytest.approx(0.25)
    assert sample(m, "request_prefill_time_seconds_sum", **fr) == pytest.approx(0.5)
    assert sample(m, "inter_token_latency_seconds_count", **fr) == 3
    assert sample(m, "inter_token_latency_seconds_sum", **fr) == pytest.approx(0.8)
    assert sample(m, "request_decode_time_seconds_sum", **fr) == pytest.approx(0.8)
    assert sample(m, "request_time_per_output_token_seconds_sum", **fr) == pytest.approx(0.8 / 3)
    assert sample(m, "e2e_request_latency_seconds_sum", **fr) == pytest.approx(1.6)
    assert sample(m, "request_prompt_tokens_sum", **fr) == 7
    assert sample(m, "request_generation_tokens_sum", **fr) == 4
    assert sample(m, "request_finished_total", finish_reason="length", **fr) == 1
    assert sample(m, "requests_total", code="200") == 1
    # buckets: the 0.75 s TTFT is in le=0.75 and not in le=0.5
    assert sample(m, "time_to_first_token_seconds_bucket", le="0.75", **fr) == 1
    assert sample(m, "time_to_first_token_seconds_bucket", le="0.5", **fr) == 0


def test_cancelled_and_failed_requests(clock: Clock) -> None:
    tel = Telemetry("m")
    gone = tel.start({}, [])
    clock.now += 1
    tel.finish(gone, 499, cancelled=True)
    failed = tel.start({}, [])
    tel.admitted(failed)
    _step(tel, SimpleNamespace(trace=failed), Record(code=424, error="x", last=True, tokens=0))
    tel.finish(failed, 424, cancelled=False)
    m = tel.metrics
    assert sample(m, "request_finished_total", adapter="", finish_reason="cancelled") == 1
    assert sample(m, "request_finished_total", adapter="", finish_reason="error") == 1
    assert sample(m, "e2e_request_latency_seconds_count", adapter="") == 2
    assert sample(m, "time_to_first_token_seconds_count", adapter="") == 0  # no token, no TTFT
    assert sample(m, "request_queue_time_seconds_count", adapter="") == 1  # only the admitted one
    assert sample(m, "request_generation_tokens_count", adapter="") == 0  # token histograms: answered requests
    assert sample(m, "generation_tokens_total", adapter="") == 0


def test_engine_stats_and_gauges() -> None:
    running = [3]
    tel = Telemetry("m", running=lambda: running[0], waiting=lambda: 2, worker_up=lambda: 1)
    stats = {"kv_cache_usage": 0.25, "kv_cache_used_bytes": 100, "kv_cache_allocated_bytes": 400, "batch_size": 3}
    tel.rolling_step([], {ENGINE_STATS_PROPERTY: json.dumps(stats)}, 3)
    tel.rolling_step([], {ENGINE_STATS_PROPERTY: "not json"}, 3)  # ignored, not fatal
    m = tel.metrics
    assert sample(m, "kv_cache_usage_perc") == 0.25
    assert sample(m, "kv_cache_allocated_bytes") == 400
    assert sample(m, "engine_batch_size") == 3
    assert sample(m, "num_requests_running") == 3 and sample(m, "num_requests_waiting") == 2
    assert sample(m, "rolling_batch_size") == 3 and sample(m, "worker_up") == 1
    running[0] = 0
    assert sample(m, "num_requests_running") == 0  # read at scrape time


def test_exposition_negotiates_openmetrics() -> None:
    m = Metrics("m")
    text, text_type = m.render(None)
    om, om_type = m.render("application/openmetrics-text; version=1.0.0")
    assert text_type.startswith("text/plain; version=0.0.4") and b"# EOF" not in text
    assert om_type.startswith("application/openmetrics-text") and om.rstrip().endswith(b"# EOF")


def test_dynamic_batch_chunks_time_tokens_but_do_not_count_them(clock: Clock) -> None:
    tel = Telemetry("m")
    trace = tel.start({}, [])
    tel.admitted(trace)
    clock.now += 0.2
    tel.chunk(trace)
    clock.now += 0.1
    tel.chunk(trace)
    tel.finish(trace, 200, cancelled=False)
    m = tel.metrics
    assert sample(m, "time_to_first_token_seconds_sum", adapter="") == pytest.approx(0.2)
    assert sample(m, "request_generation_tokens_count", adapter="") == 0  # chunks are not tokens
    assert sample(m, "request_finished_total", adapter="", finish_reason="unknown") == 1


def test_request_ids() -> None:
    assert request_id_of([(b"x-request-id", b"abc-1")]) == "abc-1"
    assert request_id_of([(b"X-Request-Id", b"abc-2")]) == "abc-2"
    for bad in (b"", b"has space", b"x" * 129, "é".encode()):
        made = request_id_of([(b"x-request-id", bad)])
        assert made != bad.decode("utf-8", "replace") and len(made) == 36


def test_finished_request_log_line(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    tel = Telemetry("m", log_prompts=True)
    trace = tel.start({REQUEST_ID_PROPERTY: "r9"}, [("data", b'{"inputs": "tell me"}')])
    _step(tel, SimpleNamespace(trace=trace), Record(data="x", last=True, tokens=1,
                                                     stats='{"prompt_tokens":2,"generated_tokens":1,'
                                                           '"finish_reason":"eos_token"}'))
    with caplog.at_level(logging.INFO, logger="djl_handlers.server.requests"):
        tel.finish(trace, 200, cancelled=False)
    record = caplog.records[-1]
    assert record.getMessage().startswith("RequestId=[r9] finished: status=200 prompt_tokens=2 generated_tokens=1")
    line = json.loads(JsonFormatter().format(record))
    assert line["request_id"] == "r9" and line["finish_reason"] == "eos_token" and line["prompt"] == "tell me"
    assert line["level"] == "INFO" and line["ttft_ms"] == 0.0


def test_slot_records_carry_step_tokens_and_final_stats() -> None:
    from djl_handlers.dialects.registry import get_formatter
    from djl_handlers.params.generation import GenerationParameters
    from djl_handlers.request.records import Request, Token
    from djl_handlers.scheduling.slot import RequestSlot

    slot = RequestSlot(Request(prompt="p", params=GenerationParameters()), get_formatter("json", stream=False), 1,
                       prompt_ids=[5, 6, 7])
    token = Token(1, "a", None)
    slot.output.tokens.append(token)
    slot.output.new_tokens.append(token)
    first = slot.record()
    assert first["step_token_num"] == 1 and STATS_RECORD_KEY not in first
    slot.finish("length")
    last = slot.record()
    assert last["step_token_num"] == 0 and last["last"] is True
    assert json.loads(last[STATS_RECORD_KEY]) == {"prompt_tokens": 3, "generated_tokens": 1, "finish_reason": "length"}
    from djl_handlers.io import wire

    decoded = decode_record(wire.binary_encode(last))
    assert decoded.tokens == 0 and decoded.stats == last[STATS_RECORD_KEY]
    assert decode_record(wire.binary_encode({"data": "x", "last": False})).tokens == 1  # no step_token_num


def test_vllm_kv_cache_usage_from_its_metrics_reader() -> None:
    from djl_handlers.engines.external.vllm import VllmEngine

    gauge = SimpleNamespace(name="vllm:kv_cache_usage_perc", value=0.125)
    other = SimpleNamespace(name="vllm:num_requests_running", value=2)
    with_reader = SimpleNamespace(engine=SimpleNamespace(get_metrics=lambda: [other, gauge]))
    assert VllmEngine.kv_cache_usage(with_reader) == {"kv_cache_usage": 0.125}  # type: ignore[arg-type]
    assert VllmEngine.kv_cache_usage(SimpleNamespace(engine=object())) is None  # type: ignore[arg-type]


def test_spans_with_in_memory_exporter(clock: Clock) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from djl_handlers.server.tracing import SpanRecorder

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tel = Telemetry("m", tracer=SpanRecorder(provider))
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    trace = tel.start({REQUEST_ID_PROPERTY: "r5", "traceparent": parent}, [])
    clock.now += 0.5
    tel.admitted(trace)
    clock.now += 0.25
    _step(tel, SimpleNamespace(trace=trace), Record(data="x", last=True, tokens=1,
                                                     stats='{"prompt_tokens":3,"generated_tokens":1,'
                                                           '"finish_reason":"length"}'))
    clock.now += 0.25
    tel.finish(trace, 200, cancelled=False)
    tel.close()
    (span,) = exporter.get_finished_spans()
    attributes: dict[str, Any] = dict(span.attributes or {})
    start, end = int(span.start_time or 0), int(span.end_time or 0)
    assert span.name == "djl_handlers.request"
    assert attributes["djl_handlers.request_id"] == "r5"
    assert attributes["gen_ai.usage.input_tokens"] == 3
    assert attributes["gen_ai.usage.output_tokens"] == 1
    assert tuple(attributes["gen_ai.response.finish_reasons"]) == ("length",)
    assert [e.name for e in span.events] == ["queued", "prefill", "decode"]
    assert [e.timestamp - start for e in span.events] == [0, 500_000_000, 750_000_000]
    assert end - start == 1_000_000_000
    assert format(span.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert span.parent is not None and format(span.parent.span_id, "016x") == "b7ad6b7169203331"


def test_no_tracer_and_no_import_without_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delitem(sys.modules, "djl_handlers.server.tracing", raising=False)
    assert Telemetry("m").tracer is None
    assert "djl_handlers.server.tracing" not in sys.modules


def test_a_telemetry_fault_never_reaches_the_step_loop(caplog: pytest.LogCaptureFixture) -> None:
    tel = Telemetry("m")
    trace = tel.start({}, [])
    broken = SimpleNamespace(tokens="many", code=None, stats=None)  # not a Record: comparison fails
    with caplog.at_level(logging.ERROR, logger="djl_handlers.server"):
        tel.rolling_step([(SimpleNamespace(owner=SimpleNamespace(trace=trace)), broken, {})], {}, 1)
        trace.created = "later"  # type: ignore[assignment]
        tel.finish(trace, 200, cancelled=False)
    assert [r.getMessage() for r in caplog.records] == [
        "telemetry: a rolling step could not be recorded", "telemetry: RequestId=[-] could not be recorded"]


def test_client_named_adapters_cannot_grow_the_series_without_bound() -> None:
    from djl_handlers.server.metrics import MAX_ADAPTER_LABELS

    tel = Telemetry("m")
    traces = [tel.start({"adapter": f"a{i}"}, []) for i in range(MAX_ADAPTER_LABELS + 10)]
    assert {t.adapter for t in traces[MAX_ADAPTER_LABELS:]} == {"__other__"}
    assert tel.start({"adapter": "x" * 65}, []).adapter == "__other__"
    assert len({t.adapter for t in traces}) == MAX_ADAPTER_LABELS + 1
