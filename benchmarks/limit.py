"""The limit: the model's raw batched decode loop vs our whole handler at equal batch and context.

*Raw*: ``model(input_ids=[B, 1], cache)`` then argmax, in a loop — no parsing, scheduling,
detokenization, formatting or wire records, no attention mask (rows are equal length), with
transformers' ``DynamicCache`` and with the preallocated slab cache our engine uses; the faster
of the two is the ceiling. *Ours*: ``B`` identical streaming requests through
``djl_handlers.huggingface``'s ``handle()`` (driven like DJL's Java loop), timed per step once
every row is decoding; ``engine.step()`` is timed inside the same steps. Same model object, same
process, measured back to back for each batch size.
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import rnd
from benchmarks.engine_throughput import new_driver, stream_body
from benchmarks.workload import TEXT


def _cache_kw(model: Any) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def raw_steps(model: Any, ids: Any, steps: int, slab: bool) -> list[float]:
    """Per-step wall seconds of a bare greedy decode loop over ``ids`` [B, T] (prefill not timed)."""
    import torch
    from transformers import DynamicCache

    from djl_handlers.engines.hf.batch import new_slab_cache

    cache = new_slab_cache(model.config) if slab else DynamicCache(config=model.config)
    kw = {_cache_kw(model): cache, "use_cache": True, "logits_to_keep": 1}
    times: list[float] = []
    with torch.inference_mode():
        tok = model(input_ids=ids, **kw).logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(steps):
            t = time.perf_counter()
            tok = model(input_ids=tok, **kw).logits[:, -1].argmax(-1, keepdim=True)
            times.append(time.perf_counter() - t)
    return times


def _timed(fn: Callable[..., Any], sink: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - t)

    return wrapper


def ours_steps(service: Any, driver: Any, prompt: str, batch: int, steps: int) -> tuple[list[float], list[float]]:
    """(handle() seconds, engine.step() seconds) per step while all ``batch`` rows decode."""
    engine = service.engine
    handle_t: list[float] = []
    engine_t: list[float] = []
    driver.handle = _timed(service.handle, handle_t)
    engine.step = _timed(type(engine).step.__get__(engine), engine_t)
    for _ in range(batch):
        driver.submit(stream_body(prompt, steps + 64, ignore_eos_token=True))
    while len(engine.running_ids) < batch:  # prefill (in chunks of max_prefill_tokens)
        driver.step()
    handle_t.clear()
    engine_t.clear()
    for _ in range(steps):
        driver.step()
    out = list(handle_t), list(engine_t)
    for req in driver.active:
        req.cancel = True
    driver.step()
    driver.handle = service.handle
    del engine.step
    return out


def run_benchmark(quick: bool) -> dict[str, Any]:
    """Raw vs ours per batch size; returns rows with per-step ms and ratios."""
    from djl_handlers.model.embedded import embedded_model_dir

    batches, context, steps = ((1, 8), 64, 6) if quick else ((1, 4, 8, 16, 32), 128, 16)
    service, driver = new_driver(str(embedded_model_dir()), max_batch=max(batches))
    model, tok = service.engine.model, service.engine.tokenizer
    import torch

    ids = tok.encode(TEXT * 10)[:context]
    prompt = tok.decode(ids)
    ids = tok.encode(prompt)
    rows = []
    for batch in batches:
        x = torch.tensor([ids] * batch, dtype=torch.long)
        dyn = raw_steps(model, x, steps, slab=False)
        slab = raw_steps(model, x, steps, slab=True)
        handle_t, engine_t = ours_steps(service, driver, prompt, batch, steps)
        dyn += raw_steps(model, x, steps, slab=False)  # raw again after ours: load drift hits both
        slab += raw_steps(model, x, steps, slab=True)
        raw = min(statistics.median(dyn), statistics.median(slab))
        ours, eng = statistics.median(handle_t), statistics.median(engine_t)
        rows.append({"batch": batch, "context": len(ids), "raw_dynamic_ms": rnd(1000 * statistics.median(dyn)),
                     "raw_slab_ms": rnd(1000 * statistics.median(slab)), "raw_step_ms": rnd(1000 * raw),
                     "ours_step_ms": rnd(1000 * ours), "engine_step_ms": rnd(1000 * eng),
                     "raw_tok_s": rnd(batch / raw, 1), "ours_tok_s": rnd(batch / ours, 1),
                     "ours_vs_raw": rnd(raw / ours), "engine_vs_raw": rnd(raw / eng)})
        print(rows[-1], flush=True)
    return {"steps_per_point": steps, "rows": rows,
            "note": "raw = min(DynamicCache, slab) bare decode loop without mask, run before and after ours "
                    "(medians of both); ours = handle() per step, engine = engine.step() inside it"}


def plot(report: dict[str, Any], plt: Any) -> Any:
    """Decode tokens/s by batch size: raw ceiling vs our handler."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    b = [r["batch"] for r in report["rows"]]
    ax.plot(b, [r["raw_tok_s"] for r in report["rows"]], "o--", color="#999", label="raw forward loop")
    ax.plot(b, [r["ours_tok_s"] for r in report["rows"]], "o-", color="#2a7", label="ours: handle() per step")
    ax.set_xlabel("batch size (rows decoding)")
    ax.set_ylabel("decode tokens/s")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    ax.set_title(f"Decode at equal batch, context {report['rows'][0]['context']} (fp32, 2 threads)", fontsize=9)
    return fig
