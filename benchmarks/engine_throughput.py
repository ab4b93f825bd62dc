"""Engine throughput on the mixed workload: our rolling batch vs sequential ``generate()`` vs one
padded static ``generate()`` batch, all in one process on the same model (ratios are what count).

Each mode generates exactly the tokens greedy decoding gives for each request (eos ends a row
early in every mode), and tokens/s counts only real generated tokens.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.workload import Job, mixed_workload
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request


@dataclass
class RunResult:
    """Wall time, generated tokens and per-request latencies of one mode."""

    name: str
    wall_s: float
    tokens: int
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    def summary(self) -> dict[str, Any]:
        def pct(values: list[float], q: float) -> float | None:
            if not values:
                return None
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

        return {
            "mode": self.name, "wall_s": round(self.wall_s, 2), "tokens": self.tokens,
            "tok_s": round(self.tok_s, 1),
            "ttft_p50_s": pct(self.ttft_s, 0.5), "ttft_p99_s": pct(self.ttft_s, 0.99),
            "itl_p50_ms": (pct(self.itl_s, 0.5) or 0) * 1000, "itl_p99_ms": (pct(self.itl_s, 0.99) or 0) * 1000,
        }


def run_rolling(model_dir: str, jobs: list[Job], max_batch: int = 32) -> RunResult:
    """All jobs through the HF handler's rolling batch, driven like DJL's Java loop."""
    service = InferenceService("huggingface")
    driver = RollingBatchDriver(service.handle)
    driver.init({"model_id": model_dir, "rolling_batch": "auto", "dtype": "fp32",
                 "max_rolling_batch_size": str(max_batch)})
    t0 = time.perf_counter()
    pending = sorted(jobs, key=lambda j: j.arrival_s)
    reqs, first, last_seen, itl = [], {}, {}, []
    while pending or driver.active:
        now = time.perf_counter() - t0
        while pending and pending[0].arrival_s <= now and len(driver.active) < max_batch:
            job = pending.pop(0)
            body = {"inputs": job.prompt, "stream": True, "parameters": {"max_new_tokens": job.max_new_tokens}}
            r = driver.submit(json_request(body))
            reqs.append((r, now))
        if not driver.active:
            time.sleep(min(0.01, max(0.0, pending[0].arrival_s - now)))
            continue
        driver.step()
        t = time.perf_counter() - t0
        for i, (r, arrived) in enumerate(reqs):
            n = len(r.chunks)
            if n and i not in first:
                first[i] = t - arrived
            if n and last_seen.get(i, (0, 0.0))[0] != n:
                if i in last_seen:
                    itl.append((t - last_seen[i][1]) / (n - last_seen[i][0]))
                last_seen[i] = (n, t)
    wall = time.perf_counter() - t0
    tokens = 0
    for r, _ in reqs:
        lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
        tokens += len(lines)
    return RunResult("rolling batch (ours)", wall, tokens, list(first.values()), itl)


def load_hf(model_dir: str) -> tuple[Any, Any]:
    """The same model and tokenizer, loaded plainly with transformers (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, tok


def _real_new_tokens(seq: Any, eos: set[int], pad: int, start: int) -> int:
    n = 0
    for t in seq[start:].tolist():
        n += 1
        if t in eos:
            break
    return n


def run_sequential(model: Any, tok: Any, jobs: list[Job]) -> RunResult:
    """One ``generate()`` call per request, one after the other."""
    import torch

    eos = {tok.eos_token_id}
    t0, tokens, ttft = time.perf_counter(), 0, []
    with torch.inference_mode():
        for job in jobs:
            ids = tok(job.prompt, return_tensors="pt")
            started = time.perf_counter()
            out = model.generate(**ids, max_new_tokens=job.max_new_tokens, do_sample=False)
            took = time.perf_counter() - started
            n = _real_new_tokens(out[0], eos, tok.pad_token_id, ids["input_ids"].shape[1])
            tokens += n
            ttft.append(started - t0 + took / max(n, 1))  # queueing + rough first-token share
    return RunResult("sequential generate()", time.perf_counter() - t0, tokens, ttft)


def run_static(model: Any, tok: Any, jobs: list[Job]) -> RunResult:
    """One left-padded ``generate()`` batch of every request (max_new_tokens = the largest)."""
    import torch

    tok.padding_side = "left"
    eos = {tok.eos_token_id}
    batch = tok([j.prompt for j in jobs], return_tensors="pt", padding=True)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=max(j.max_new_tokens for j in jobs), do_sample=False)
    wall = time.perf_counter() - t0
    start = batch["input_ids"].shape[1]
    tokens = sum(min(_real_new_tokens(row, eos, tok.pad_token_id, start), j.max_new_tokens)
                 for row, j in zip(out, jobs))
    return RunResult("one padded static generate()", wall, tokens, [wall] * len(jobs))


def ratios(results: dict[str, RunResult]) -> dict[str, float]:
    ours = results["rolling"].tok_s
    return {f"rolling / {k}": round(ours / r.tok_s, 2) for k, r in results.items() if k != "rolling" and r.tok_s}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
