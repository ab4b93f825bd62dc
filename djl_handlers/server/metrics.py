"""The local server's Prometheus metrics (``GET /metrics``), built with ``prometheus-client``.

Every series is prefixed ``djl_handlers_`` and labelled ``model``; per-request series also carry
``adapter`` (empty when the request names none). Names, meanings and buckets follow vLLM's
(``vllm/v1/metrics/loggers.py``) so dashboards written for vLLM need only the prefix changed; the
list with meanings is in ``docs/observability.md``. One private ``CollectorRegistry`` per runtime
(no global state); gauges that mirror runtime state are read by callbacks at scrape time, so the
step loop pays nothing for them. Content negotiation (Prometheus text 0.0.4 or OpenMetrics) is
``prometheus_client``'s ``choose_encoder``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

__all__ = [
    "FINISH_REASONS",
    "ITL_BUCKETS",
    "LATENCY_BUCKETS",
    "TTFT_BUCKETS",
    "Metrics",
    "RequestSeries",
    "token_buckets",
]

PREFIX = "djl_handlers_"
# vLLM's buckets (seconds): time to first token; time per output token / inter-token latency;
# request latencies (end-to-end, queue, prefill, decode).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
POOLING_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FINISH_REASONS = ("length", "eos_token", "stop_sequence", "error", "cancelled")
DEFAULT_MAX_TOKENS = 131072
MAX_ADAPTER_LABELS = 64  # a client names the adapter: bound the series it can create
OTHER_ADAPTER = "__other__"


def token_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series up to ``max_value`` (the model's context length): 1, 2, 5, 10, 20, ..."""
    buckets: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(buckets) or (1.0,)
            buckets.append(float(mantissa * scale))
        scale *= 10


@dataclass
class RequestSeries:
    """The per-request series bound to one (model, adapter) label set (label lookup done once)."""

    adapter: str
    ttft: Any
    itl: Any
    tpot: Any
    e2e: Any
    queue: Any
    prefill: Any
    decode: Any
    prompt_tokens: Any
    generation_tokens: Any
    prompt_total: Any
    generation_total: Any


class Metrics:
    """Definitions, bound children and exposition of every series of one model."""

    def __init__(self, model: str = "model", *, running: Callable[[], float] = lambda: 0,
                 waiting: Callable[[], float] = lambda: 0, worker_up: Callable[[], float] = lambda: 0,
                 max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        """``running``/``waiting``/``worker_up`` are read at scrape time."""
        self.model = model
        self.registry = CollectorRegistry(auto_describe=True)
        self._series: dict[str, RequestSeries] = {}
        self.rolling_batch_size = 0
        self._pooling: tuple[Counter, Counter, Histogram] | None = None  # created by the first pooling request
        reg, one = self.registry, ("model",)
        req = ("model", "adapter")

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, req, registry=reg, buckets=buckets)

        tokens = token_buckets(max_tokens)
        self._h = {
            "ttft": hist("time_to_first_token_seconds", "Time from arrival to the first generated token.",
                         TTFT_BUCKETS),
            "itl": hist("inter_token_latency_seconds", "Time between two consecutive tokens of a request.",
                        ITL_BUCKETS),
            "tpot": hist("request_time_per_output_token_seconds",
                         "Per request: decode time divided by (generated tokens - 1).", ITL_BUCKETS),
            "e2e": hist("e2e_request_latency_seconds", "Time from arrival to the last byte of the response.",
                        LATENCY_BUCKETS),
            "queue": hist("request_queue_time_seconds", "Time a request waited before it joined a batch.",
                          LATENCY_BUCKETS),
            "prefill": hist("request_prefill_time_seconds", "Time from joining a batch to the first token.",
                            LATENCY_BUCKETS),
            "decode": hist("request_decode_time_seconds", "Time from the first token to the last one.",
                           LATENCY_BUCKETS),
            "prompt_tokens": hist("request_prompt_tokens", "Prompt tokens per request (after truncation).",
                                  tokens),
            "generation_tokens": hist("request_generation_tokens", "Generated tokens per request.", tokens),
        }
        self._prompt_total = Counter(PREFIX + "prompt_tokens", "Prompt tokens processed.", req, registry=reg)
        self._generation_total = Counter(PREFIX + "generation_tokens", "Tokens generated.", req, registry=reg)
        self.finished = Counter(PREFIX + "request_finished", "Finished requests by finish reason.",
                                ("model", "adapter", "finish_reason"), registry=reg)
        self.requests = Counter(PREFIX + "requests", "Finished HTTP inference requests by status code.",
                                ("model", "code"), registry=reg)
        self.cancelled = Counter(PREFIX + "cancelled", "Requests whose client went away.", one,
                                 registry=reg).labels(model)
        self.restarts = Counter(PREFIX + "worker_restarts", "Worker processes restarted after dying.", one,
                                registry=reg).labels(model)

        def gauge(name: str, doc: str, fn: Callable[[], float] | None = None) -> Any:
            child = Gauge(PREFIX + name, doc, one, registry=reg).labels(model)
            if fn is not None:
                child.set_function(fn)
            return child

        gauge("num_requests_running", "Requests in the worker's batch.", running)
        gauge("num_requests_waiting", "Requests waiting in the server's queue.", waiting)
        gauge("in_flight", "Same as num_requests_running (DJL-style name).", running)
        gauge("queue_depth", "Same as num_requests_waiting (DJL-style name).", waiting)
        gauge("worker_up", "1 when the worker process is alive and initialized.", worker_up)
        gauge("rolling_batch_size", "Requests in the last rolling-batch step.", lambda: self.rolling_batch_size)
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache use reported by the engine, 0..1 (HF: slab "
                              "bytes holding tokens / bytes allocated; vLLM: its own kv_cache_usage_perc).")
        self.kv_used = gauge("kv_cache_used_bytes", "KV-cache bytes holding tokens (HF engine).")
        self.kv_allocated = gauge("kv_cache_allocated_bytes", "KV-cache bytes allocated (HF engine).")
        self.kv_per_token = gauge("kv_cache_bytes_per_token", "KV-cache bytes one cached token takes over every "
                                  "layer (HF engine).")
        self.kv_max = gauge("kv_cache_max_bytes", "The KV-cache bound, option.kv_cache_memory_bytes (HF engine).")
        self.kv_mirror = gauge("kv_cache_mirror_bytes", "KV bytes of the decode graphs' mirror, within the bound "
                               "(HF engine, option.decode_graphs).")
        self.engine_batch = gauge("engine_batch_size", "Requests in the engine's batch (worker's count).")
        # vLLM's prefix_cache_queries / prefix_cache_hits (tokens); the worker reports running totals
        self._totals = {
            key: Counter(PREFIX + key, doc, one, registry=reg).labels(model)
            for key, doc in (("prefix_cache_queries", "Prompt tokens looked up in the prefix cache (HF engine)."),
                             ("prefix_cache_hits", "Prompt tokens whose KV came from the prefix cache (HF engine)."))
        }
        self._totals_seen = dict.fromkeys(self._totals, 0)
        # speculative decoding (HF engine's prompt lookup): vLLM's spec_decode_* counters, running totals too
        for key, doc in (("spec_decode_num_drafts", "Rows that verified speculative candidates, per step (HF engine)."),
                         ("spec_decode_num_draft_tokens", "Speculative candidate tokens verified (HF engine)."),
                         ("spec_decode_num_accepted_tokens", "Speculative candidate tokens accepted (HF engine)."),
                         ("spec_decode_num_declined_steps", "Decode steps that had speculative candidates and ran "
                          "the plain step, as verifying was not expected to pay (HF engine).")):
            self._totals[key] = Counter(PREFIX + key, doc, one, registry=reg).labels(model)
            self._totals_seen[key] = 0
        self.spec_rate = gauge("spec_decode_acceptance_rate", "Accepted / verified speculative tokens since the "
                               "worker started (HF engine).")
        self.spec_tokens = gauge("spec_decode_tokens_per_step", "Tokens a decoding row gets per step since the "
                                 "worker started, 1 without speculation (HF engine).")

    def series(self, adapter: str = "") -> RequestSeries:
        """The per-request series for ``adapter``, bound once and cached. Past ``MAX_ADAPTER_LABELS``
        distinct names (or a name over 64 characters) the label is ``__other__``."""
        found = self._series.get(adapter)
        if found is None and (len(adapter) > 64 or len(self._series) >= MAX_ADAPTER_LABELS):
            adapter = OTHER_ADAPTER
            found = self._series.get(adapter)
        if found is None:
            labels = (self.model, adapter)
            h = {key: hist.labels(*labels) for key, hist in self._h.items()}
            found = RequestSeries(adapter, **h, prompt_total=self._prompt_total.labels(*labels),
                                  generation_total=self._generation_total.labels(*labels))
            self._series[adapter] = found
        return found

    def engine_stats(self, stats: dict[str, Any]) -> None:
        """Apply one ``ENGINE_STATS_PROPERTY`` payload from the worker."""
        for key, child in (("kv_cache_usage", self.kv_usage), ("kv_cache_used_bytes", self.kv_used),
                           ("kv_cache_allocated_bytes", self.kv_allocated), ("batch_size", self.engine_batch),
                           ("kv_bytes_per_token", self.kv_per_token), ("kv_cache_max_bytes", self.kv_max),
                           ("kv_cache_mirror_bytes", self.kv_mirror),
                           ("spec_decode_acceptance_rate", self.spec_rate),
                           ("spec_decode_tokens_per_step", self.spec_tokens)):
            value = stats.get(key)
            if isinstance(value, (int, float)):
                child.set(value)
        for key, counter in self._totals.items():
            total = stats.get(key)
            if isinstance(total, int):  # a running total: add what is new (all of it after a worker restart)
                seen = self._totals_seen[key]
                counter.inc(total - seen if total >= seen else total)
                self._totals_seen[key] = total

    def pooling(self, stats: dict[str, Any]) -> None:
        """One embedding or reranking request's stats (``kind``, ``inputs``, ``batches``) from the worker."""
        if self._pooling is None:
            reg, labels = self.registry, ("model", "kind")
            self._pooling = (
                Counter(PREFIX + "pooling_requests", "Embedding and reranking requests answered.", labels,
                        registry=reg),
                Counter(PREFIX + "pooling_inputs", "Texts (or pairs) embedded or scored.", labels, registry=reg),
                Histogram(PREFIX + "pooling_batch_size", "Texts (or pairs) per forward pass of a pooling model.",
                          labels, registry=reg, buckets=POOLING_BATCH_BUCKETS),
            )
        requests, inputs, batches = self._pooling
        kind = str(stats.get("kind"))[:32]
        requests.labels(self.model, kind).inc()
        if isinstance(stats.get("inputs"), int):
            inputs.labels(self.model, kind).inc(stats["inputs"])
        for size in stats.get("batches") or ():
            if isinstance(size, int):
                batches.labels(self.model, kind).observe(size)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition in the format the ``Accept`` header asks for: ``(body, content type)``."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
