"""Observability through the real server over HTTP, with the tiny Llama on the HF engine (rolling batch):
the latency/token histograms agree with what the clients measured, ``x-request-id`` round-trips (given
and generated) into headers, OpenAI ids and the finished-request log line, KV-cache use is reported.
JSON logs and ``--log-prompts`` are checked with the fake rolling handler (no model needed)."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401
from prometheus_client.parser import text_string_to_metric_families
from test_server_harness import ServerProcess, copy_model, wait_until

PROMPTS = ["Deep learning is", "The quick brown fox jumps over the lazy dog because", "Hi",
           "Once upon a time in a land far away there lived a"]


def scrape(server: ServerProcess, accept: str | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``/metrics`` parsed: sample name -> [(labels, value)]."""
    with server.client() as client:
        response = client.get("/metrics", headers={"accept": accept} if accept else {})
    assert response.status_code == 200
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return samples


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(v for found, v in samples.get("djl_handlers_" + name, [])
               if all(found.get(k) == want for k, want in labels.items()))


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[ServerProcess]:  # noqa: F811
    base = tmp_path_factory.mktemp("observability")
    model = base / "tiny"
    model.mkdir()
    (model / "serving.properties").write_text(
        "engine=Python\noption.entryPoint=djl_handlers.huggingface\n"
        f"option.model_id={tiny_dir}\noption.rolling_batch=scheduler\noption.max_rolling_batch_size=8\n"
        "option.dtype=fp32\n", encoding="utf-8")
    server = ServerProcess(model, base / "server.log")
    yield server
    server.stop()


@dataclass
class Measured:
    """What one client saw."""

    request_id: str
    stream: bool
    total: float
    first: float | None
    prompt_tokens: int
    generated: int
    finish_reason: str


def _lmi(server: ServerProcess, tokenizer: Any, prompt: str, tokens: int, stream: bool) -> Measured:
    body = {"inputs": prompt, "stream": stream, "parameters": {"max_new_tokens": tokens, "details": True}}
    with server.client() as client:
        start = time.monotonic()  # after the client is built: its set-up is no part of the request
        first = None
        with client.stream("POST", "/invocations", json=body) as response:
            chunks = []
            for chunk in response.iter_bytes():
                if chunk and first is None:
                    first = time.monotonic() - start
                chunks.append(chunk)
            elapsed = time.monotonic() - start
    assert response.status_code == 200, b"".join(chunks)
    text = b"".join(chunks).decode()
    last = json.loads(text.strip().splitlines()[-1]) if stream else json.loads(text)
    details = last["details"]
    return Measured(response.headers["x-request-id"], stream, elapsed, first, len(tokenizer.encode(prompt)),
                    details["generated_tokens"], details["finish_reason"])


def _chat(server: ServerProcess, prompt: str, tokens: int, stream: bool) -> Measured:
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": prompt}],
                            "max_tokens": tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    with server.client() as client:
        start = time.monotonic()
        first = None
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            chunks = []
            for chunk in response.iter_bytes():
                if chunk and first is None:
                    first = time.monotonic() - start
                chunks.append(chunk)
            elapsed = time.monotonic() - start
    assert response.status_code == 200
    text = b"".join(chunks).decode()
    if stream:
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        usage = events[-1]["usage"]
        reason = next(e["choices"][0]["finish_reason"] for e in events if e["choices"]
                      and e["choices"][0].get("finish_reason"))
    else:
        parsed = json.loads(text)
        usage, reason = parsed["usage"], parsed["choices"][0]["finish_reason"]
    return Measured(response.headers["x-request-id"], stream, elapsed, first, usage["prompt_tokens"],
                    usage["completion_tokens"], "length" if reason == "length" else "stop")


def test_histograms_match_what_clients_measured(tiny_server: ServerProcess, tiny_dir: Path) -> None:  # noqa: F811
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    before = scrape(tiny_server)
    jobs = []
    for index, prompt in enumerate(PROMPTS):
        for stream in (False, True):
            jobs.append(("lmi", prompt, 3 + 7 * index, stream))
        jobs.append(("chat", prompt, 2 + 5 * index, index % 2 == 0))
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(
            lambda job: _lmi(tiny_server, tokenizer, job[1], job[2], job[3]) if job[0] == "lmi"
            else _chat(tiny_server, job[1], job[2], job[3]), jobs))
    after = scrape(tiny_server)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    n = len(results)
    generated = sum(r.generated for r in results)
    # token counts are exact: the worker reports them in each request's last record
    assert delta("request_generation_tokens_count") == n
    assert delta("request_generation_tokens_sum") == generated
    assert delta("generation_tokens_total") == generated
    assert delta("request_prompt_tokens_count") == n
    assert delta("request_prompt_tokens_sum") == sum(r.prompt_tokens for r in results)
    # one inter-token gap per token after the first (one token per request per rolling step)
    assert delta("inter_token_latency_seconds_count") == generated - n
    assert delta("time_to_first_token_seconds_count") == n
    assert delta("e2e_request_latency_seconds_count") == n
    assert delta("requests_total", code="200") == n
    # finish reasons: LMI details name them; OpenAI says "length" or "stop" (eos or stop sequence)
    lengths = sum(r.finish_reason == "length" for r in results)
    assert delta("request_finished_total", finish_reason="length") == lengths
    assert delta("request_finished_total") == n
    # times: the server's interval for a request lies inside the client's
    e2e = delta("e2e_request_latency_seconds_sum")
    client_total = sum(r.total for r in results)
    ttft, itl = delta("time_to_first_token_seconds_sum"), delta("inter_token_latency_seconds_sum")
    client_first = sum((r.first if r.stream and r.first is not None else r.total) for r in results)
    timings = f"server e2e {e2e:.3f} ttft {ttft:.3f} itl {itl:.3f}; client {client_total:.3f} first {client_first:.3f}"
    assert 0.5 * client_total <= e2e <= client_total, timings
    assert 0 < ttft <= client_first, timings
    assert ttft + itl <= e2e, timings  # arrival -> last token, inside arrival -> last byte
    assert delta("request_decode_time_seconds_sum") == pytest.approx(itl, rel=1e-6, abs=1e-6)
    queue, prefill = delta("request_queue_time_seconds_sum"), delta("request_prefill_time_seconds_sum")
    assert queue + prefill == pytest.approx(ttft, rel=1e-6, abs=1e-6)
    for name in ("num_requests_running", "num_requests_waiting"):
        assert total(after, name) == 0
    assert {r.request_id for r in results}.__len__() == n  # a fresh id per request


def test_kv_cache_use_is_reported_while_a_request_runs(tiny_server: ServerProcess) -> None:
    body = {"inputs": "KV", "parameters": {"max_new_tokens": 300, "ignore_eos_token": True}}
    with ThreadPoolExecutor(1) as pool, tiny_server.client() as client:
        pending = pool.submit(client.post, "/invocations", json=body)
        wait_until(lambda: total(scrape(tiny_server), "kv_cache_allocated_bytes") > 0, "a KV-cache figure")
        seen = scrape(tiny_server)
        assert pending.result().status_code == 200
    assert 0 < total(seen, "kv_cache_used_bytes") <= total(seen, "kv_cache_allocated_bytes")
    assert 0 < total(seen, "kv_cache_usage_perc") <= 1
    wait_until(lambda: total(scrape(tiny_server), "kv_cache_allocated_bytes") == 0, "the cache to be freed")


def test_request_id_round_trips(tiny_server: ServerProcess) -> None:
    given = "my-trace-" + uuid.uuid4().hex[:8]
    with tiny_server.client() as client:
        chat = client.post("/v1/chat/completions", headers={"x-request-id": given, "requestId": "spoofed"},
                           json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        plain = client.post("/invocations", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}})
        bad = client.post("/invocations", headers={"x-request-id": "has spaces"}, json={"inputs": 1})
        missing = client.post("/predictions/nope", json={"inputs": "Hi"})
    assert chat.headers["x-request-id"] == given
    assert chat.json()["id"] == f"chatcmpl-{given}"
    generated = plain.headers["x-request-id"]
    assert str(uuid.UUID(generated)) == generated  # DJL makes a random UUID
    assert bad.status_code == 400 and bad.headers["x-request-id"] not in ("", "has spaces")
    assert missing.status_code == 404 and missing.headers["x-request-id"]  # every response carries one
    log = tiny_server.log_path.read_text(encoding="utf-8")
    line = next(x for x in log.splitlines() if f"RequestId=[{given}] finished:" in x)
    assert re.search(r"status=200 prompt_tokens=\d+ generated_tokens=2 ttft_ms=[\d.]+ total_ms=[\d.]+ "
                     r"finish_reason=\w+", line), line
    assert "prompt=" not in line  # no prompt text without --log-prompts
    assert f"RequestId=[{generated}] finished: status=200" in log


def test_openmetrics_negotiation(tiny_server: ServerProcess) -> None:
    with tiny_server.client() as client:
        plain = client.get("/metrics")
        open_metrics = client.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    assert open_metrics.text.rstrip().endswith("# EOF")
    assert "# TYPE djl_handlers_time_to_first_token_seconds histogram" in open_metrics.text


def test_json_logs_and_log_prompts(tmp_path: Path) -> None:
    for log_prompts in (True, False):
        args = ("--log-format", "json") + (("--log-prompts",) if log_prompts else ())
        server = ServerProcess(copy_model(tmp_path / str(log_prompts), "fake_rolling"),
                               tmp_path / f"server-{log_prompts}.log", args=args)
        try:
            with server.client() as client:
                response = client.post("/invocations", headers={"x-request-id": "json-1"},
                                       json={"inputs": "secret prompt", "parameters": {"max_new_tokens": 3}})
            assert response.status_code == 200
        finally:
            server.stop()
        records = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
        assert records and all({"ts", "level", "logger", "message"} <= set(r) for r in records)
        finished = next(r for r in records if r.get("request_id") == "json-1" and "status" in r)
        assert finished["status"] == 200 and finished["generated_tokens"] == 3
        assert finished["ttft_ms"] is not None and finished["total_ms"] >= finished["ttft_ms"]
        assert ("prompt" in finished) is log_prompts
        if log_prompts:
            assert finished["prompt"] == "secret prompt"
        else:
            assert "secret prompt" not in server.log_path.read_text()


def test_spans_exported_over_otlp_to_a_loopback_collector(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            received.append((self.path, self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    collector = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_address[1]}",
           "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "obs-test"}
    server = ServerProcess(copy_model(tmp_path, "fake_rolling"), tmp_path / "server.log", env=env)
    try:
        with server.client() as client:
            response = client.post("/invocations", headers={"x-request-id": "span-1"},
                                   json={"inputs": "traced", "parameters": {"max_new_tokens": 2}})
        assert response.status_code == 200
    finally:
        server.stop()  # shutdown flushes the batch processor
        collector.shutdown()
    spans = []
    for path, body in received:
        assert path == "/v1/traces"
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        for resource_spans in message.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
            assert service == "obs-test"
            spans += [s for scope in resource_spans.scope_spans for s in scope.spans]
    (span,) = [s for s in spans if s.name == "djl_handlers.request"]
    attributes = {a.key: a.value for a in span.attributes}
    assert attributes["djl_handlers.request_id"].string_value == "span-1"
    assert attributes["gen_ai.usage.output_tokens"].int_value == 2
    assert [e.name for e in span.events] == ["queued", "prefill", "decode"]
