"""Memory: peak RSS per concurrent request, KV-cache growth, and RSS back to baseline after load.

In this process (the handler's, as the worker would be): after loading the model and one warm-up
request, ``C`` streaming requests (same prompt length, same ``max_new_tokens``, eos ignored) run
through ``handle()`` for C in a few levels. Every step records the process RSS and the bytes the
running batch's KV cache really holds (slab capacity of every layer). After each level, and at
the end after ``gc.collect()`` (+ glibc ``malloc_trim(0)``, to tell allocator retention from a
leak), RSS is read again. Theory: per token, KV = 2 x layers x kv_heads x head_dim x 4 bytes.
"""

from __future__ import annotations

import ctypes
import gc
import time
from typing import Any

from benchmarks.common import rnd
from benchmarks.engine_throughput import new_driver, stream_body
from benchmarks.workload import TEXT

MIB = 1024 * 1024


def rss_mib() -> float:
    """Current resident set size of this process, MiB (Linux /proc)."""
    with open("/proc/self/statm", encoding="ascii") as fh:
        pages = int(fh.read().split()[1])
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / MIB


def kv_bytes(engine: Any) -> int:
    """Bytes held by the running batch's KV slabs (capacity, not just the used view)."""
    batch = getattr(engine, "_batch", None)
    if batch is None:
        return 0
    total = 0
    for layer in batch.cache.layers:
        for name in ("_k", "_v"):
            t = getattr(layer, name, None)
            if t is not None:
                total += t.numel() * t.element_size()
    return total


def trim() -> float:
    """gc + glibc malloc_trim; returns RSS afterwards."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return rss_mib()


def kv_theory_per_token(config: Any) -> int:
    """Bytes of K and V per token for all layers (fp32)."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * 4


def run_level(service: Any, driver: Any, prompt: str, concurrent: int, new_tokens: int) -> dict[str, Any]:
    """``concurrent`` requests at once; peak RSS and KV over the run."""
    before = trim()
    peak_rss, peak_kv, samples = before, 0, []
    for _ in range(concurrent):
        driver.submit(stream_body(prompt, new_tokens, ignore_eos_token=True))
    t0 = time.perf_counter()
    while driver.active:
        driver.step()
        rss, kv = rss_mib(), kv_bytes(service.engine)
        peak_rss, peak_kv = max(peak_rss, rss), max(peak_kv, kv)
        samples.append((round(time.perf_counter() - t0, 2), round(rss, 1), round(kv / MIB, 1)))
    after = trim()
    return {"concurrent": concurrent, "rss_before_mib": rnd(before, 1), "peak_rss_mib": rnd(peak_rss, 1),
            "rss_after_mib": rnd(after, 1), "rss_per_request_mib": rnd((peak_rss - before) / concurrent, 2),
            "kv_peak_mib": rnd(peak_kv / MIB, 1), "kv_per_request_mib": rnd(peak_kv / MIB / concurrent, 2),
            "samples": samples}


def run_benchmark(quick: bool) -> dict[str, Any]:
    """The levels, the theory and the back-to-baseline check."""
    from djl_handlers.model.embedded import embedded_model_dir

    levels, plen, new_tokens = ((1, 4), 64, 16) if quick else ((1, 8, 32), 256, 128)
    rss_start = rss_mib()
    service, driver = new_driver(str(embedded_model_dir()), max_batch=max(levels))
    tok = service.engine.tokenizer
    prompt = tok.decode(tok.encode(TEXT * 20)[:plen])
    driver.submit(stream_body(prompt, 4))
    driver.run()
    baseline = trim()
    per_token = kv_theory_per_token(service.engine.model.config)
    context = len(tok.encode(prompt)) + new_tokens
    rows = []
    for c in levels:
        row = run_level(service, driver, prompt, c, new_tokens)
        row["kv_theory_per_request_mib"] = rnd(per_token * context / MIB, 2)
        rows.append(row)
        print({k: v for k, v in row.items() if k != "samples"}, flush=True)
    end = trim()
    return {"process_before_model_mib": rnd(rss_start, 1), "baseline_after_load_mib": rnd(baseline, 1),
            "rss_end_mib": rnd(end, 1), "back_to_baseline_delta_mib": rnd(end - baseline, 1),
            "kv_bytes_per_token": per_token, "context_tokens_per_request": context, "rows": rows}


def plot(report: dict[str, Any], plt: Any) -> Any:
    """RSS and KV over time for each concurrency level."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    base = report["baseline_after_load_mib"]
    for row in report["rows"]:
        t = [s[0] for s in row["samples"]]
        line, = ax.plot(t, [s[1] - base for s in row["samples"]], label=f"RSS - baseline, {row['concurrent']} req")
        ax.plot(t, [s[2] for s in row["samples"]], "--", color=line.get_color(),
                label=f"KV slabs, {row['concurrent']} req")
    ax.set_xlabel("seconds since the requests arrived")
    ax.set_ylabel("MiB")
    ax.legend(fontsize=7)
    ax.set_title("Memory per concurrency level (fp32)", fontsize=9)
    return fig
