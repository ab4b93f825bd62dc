"""Per-step overhead of each of our layers at batch 16, in µs per step, vs the decode step.

16 streaming requests run through ``djl_handlers.huggingface``'s ``handle()`` (driven like DJL's
Java loop) while timing wrappers accumulate the time spent in each layer over the decode-only
steps:

- ``parse``: ``InferenceService._parse`` (once per request; amortised over its steps);
- ``detokenize``: ``IncrementalDetokenizer.push``;
- ``format``: the jsonlines formatter;
- ``schedule``: ``RollingBatch.step`` minus ``engine.step``, detokenize and format (slots, stop
  checks, records, releases);
- ``handler glue``: ``handle()`` minus ``RollingBatch.step`` and parse (batch split, ``Output``
  with one binary record per request);
- ``wire codec``: the worker's frame work for one such step, timed separately on the captured
  step: ``read_input_frame`` + building the Input, ``Output.send`` into a buffer.

The engine's own Python (compaction, sampling, emit) is inside ``engine.step`` and is not counted
here; see ``profile``. The observability code (server telemetry, the worker's stats) is reported
apart, as ``metrics`` rows (``benchmarks/metrics_overhead.py``).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import rnd
from benchmarks.engine_throughput import new_driver, stream_body
from benchmarks.metrics_overhead import metrics_layers
from benchmarks.workload import TEXT

Sink = dict[str, float]


def _wrap(owner: Any, name: str, sink: Sink, key: str) -> Callable[[], None]:
    """Replace ``owner.name`` by a timed wrapper adding to ``sink[key]``; returns an undo."""
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sink[key] = sink.get(key, 0.0) + time.perf_counter() - t

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original) if isinstance(owner, type) else delattr(owner, name)


def wire_us(inputs: Any, output: Any, repeat: int = 200) -> float:
    """µs for the worker's frame work of one step: decode the request frame, encode the reply."""
    from djl_handlers.io import wire
    from djl_handlers.io.compat import input_from_frame

    content = [(inputs.content.key_at(i), bytes(inputs.content.value_at(i))) for i in range(inputs.content.size())]
    frame = wire.encode_input_frame(inputs.get_properties(), content)
    t = time.perf_counter()
    for _ in range(repeat):
        props, entries = wire.read_input_frame(io.BytesIO(frame))
        input_from_frame(props, entries)
        output.send(io.BytesIO())
    return (time.perf_counter() - t) / repeat * 1e6


def run_benchmark(quick: bool, batch: int = 16) -> dict[str, Any]:
    """Run the batch with every layer timed; returns µs/step per layer and % of the decode step."""
    from djl_handlers.formatting.lmi import JsonLinesFormatter
    from djl_handlers.model.embedded import embedded_model_dir
    from djl_handlers.scheduling.detokenizer import IncrementalDetokenizer
    from djl_handlers.scheduling.rolling import RollingBatch

    steps = 8 if quick else 48
    service, driver = new_driver(str(embedded_model_dir()), max_batch=batch)
    engine = service.engine
    prompt = engine.tokenizer.decode(engine.tokenizer.encode(TEXT * 4)[:64])
    sink: Sink = {}
    captured: list[Any] = []

    def handle(inputs: Any) -> Any:
        t = time.perf_counter()
        out = service.handle(inputs)
        sink["handle"] = sink.get("handle", 0.0) + time.perf_counter() - t
        captured[:] = [inputs, out]
        return out

    undo = [_wrap(engine, "step", sink, "engine"), _wrap(service, "_parse", sink, "parse"),
            _wrap(IncrementalDetokenizer, "push", sink, "detokenize"),
            _wrap(JsonLinesFormatter, "__call__", sink, "format"), _wrap(RollingBatch, "step", sink, "rolling")]
    driver.handle = handle
    try:
        for _ in range(batch):
            driver.submit(stream_body(prompt, steps + 2, ignore_eos_token=True))
        while len(engine.running_ids) < batch:
            driver.step()
        parse_total = sink.get("parse", 0.0)
        sink.clear()
        for _ in range(steps):
            driver.step()
        measured, step_io = dict(sink), list(captured)
        observability = metrics_layers(service, step_io[1], steps + 2)
        driver.run()
    finally:
        for fn in undo:
            fn()
    per = {k: v / steps * 1e6 for k, v in measured.items()}
    parse_per_step = parse_total / (steps + 2) * 1e6  # 16 parses spread over the requests' steps+2 steps
    layers = {
        "parse (amortised)": parse_per_step,
        "schedule": per["rolling"] - per["engine"] - per.get("detokenize", 0) - per.get("format", 0),
        "detokenize": per.get("detokenize", 0.0),
        "format": per.get("format", 0.0),
        "handler glue + records": per["handle"] - per["rolling"],
        "wire codec (worker frames)": wire_us(*step_io),
    }
    engine_us = per["engine"]
    rows = [{"layer": k, "us_per_step": rnd(v, 1), "pct_of_decode_step": rnd(100 * v / engine_us, 2)}
            for k, v in layers.items()]
    total = sum(layers.values())
    metrics_rows = [{"layer": k, "us_per_step": rnd(v, 1), "pct_of_decode_step": rnd(100 * v / engine_us, 3)}
                    for k, v in observability.items()]
    metrics_total = sum(observability.values())
    return {"batch": batch, "steps": steps, "prompt_tokens": len(engine.tokenizer.encode(prompt)),
            "engine_step_ms": rnd(engine_us / 1000), "parse_us_per_request": rnd(parse_total / batch * 1e6, 1),
            "layers": rows, "total_overhead_us": rnd(total, 1), "total_overhead_pct": rnd(100 * total / engine_us, 2),
            "metrics": metrics_rows, "metrics_us_per_step": rnd(metrics_total, 1),
            "metrics_fraction_of_decode_step": rnd(metrics_total / engine_us, 5)}
