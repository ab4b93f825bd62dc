"""Engine throughput on the mixed workload: our rolling batch (``djl_handlers.huggingface`` driven
like DJL's Java loop) vs sequential ``generate()`` vs one padded static ``generate()`` batch, all in
one process on the same fp32 model, with all-at-once or Poisson arrivals (ratios are what count).

Every mode generates exactly the tokens greedy decoding gives each request (eos ends a row early
in every mode); tokens/s counts only real generated tokens. Each generated token gets a wall-clock
timestamp (rolling: the step that returned it; ``generate()``: a streamer called once per step),
which gives time to first token (from the request's arrival) and inter-token latency per request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import pct, rnd
from benchmarks.workload import Job
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import DriverRequest, RollingBatchDriver, json_request


@dataclass
class RunResult:
    """Wall time, per-request token timestamps (s since start) and texts of one mode."""

    name: str
    wall_s: float = 0.0
    cpu_s: float = 0.0  # process CPU time: less sensitive to other jobs on the box than wall time
    times: list[list[float]] = field(default_factory=list)  # per job, one timestamp per token
    arrivals: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)  # rolling only: rows per decode step

    @property
    def tokens(self) -> int:
        return sum(len(t) for t in self.times)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    def summary(self) -> dict[str, Any]:
        """tok/s, TTFT and inter-token latency percentiles."""
        ttft = [t[0] - a for t, a in zip(self.times, self.arrivals, strict=True) if t]
        itl = [b - a for t in self.times for a, b in zip(t, t[1:], strict=False)]
        row = {"mode": self.name, "wall_s": rnd(self.wall_s), "tokens": self.tokens, "tok_s": rnd(self.tok_s, 1),
               "tok_per_cpu_s": rnd(self.tokens / self.cpu_s, 1) if self.cpu_s else None,
               "ttft_p50_s": rnd(pct(ttft, 0.5)), "ttft_p99_s": rnd(pct(ttft, 0.99)),
               "itl_p50_ms": rnd(1000 * (pct(itl, 0.5) or 0), 1), "itl_p99_ms": rnd(1000 * (pct(itl, 0.99) or 0), 1)}
        if self.batch_sizes:
            row["mean_batch"] = rnd(sum(self.batch_sizes) / len(self.batch_sizes), 1)
            row["max_batch"] = max(self.batch_sizes)
        return row


def new_driver(model_dir: str, max_batch: int = 32, **options: str) -> tuple[InferenceService, RollingBatchDriver]:
    """The HF handler's service behind a RollingBatchDriver (DJL's Java loop, in process)."""
    service = InferenceService("huggingface")
    driver = RollingBatchDriver(service.handle)
    driver.init({"model_id": model_dir, "rolling_batch": "auto", "dtype": "fp32",
                 "max_rolling_batch_size": str(max_batch), **options})
    return service, driver


def stream_body(prompt: str, max_new_tokens: int, **params: Any) -> DriverRequest:
    """A streaming (jsonlines) request."""
    return json_request({"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": max_new_tokens, **params}})


def run_rolling(model_dir: str, jobs: list[Job], max_batch: int = 32) -> RunResult:
    """All jobs through the HF handler's rolling batch, admitted at their arrival times."""
    service, driver = new_driver(model_dir, max_batch)
    result = RunResult("rolling batch (ours)", arrivals=[j.arrival_s for j in jobs])
    result.times = [[] for _ in jobs]
    submitted: list[tuple[int, DriverRequest]] = []
    pending = sorted(range(len(jobs)), key=lambda i: jobs[i].arrival_s)
    t0, c0 = time.perf_counter(), time.process_time()
    while pending or driver.active:
        now = time.perf_counter() - t0
        while pending and jobs[pending[0]].arrival_s <= now and len(driver.active) < max_batch:
            i = pending.pop(0)
            submitted.append((i, driver.submit(stream_body(jobs[i].prompt, jobs[i].max_new_tokens))))
        if not driver.active:
            time.sleep(min(0.01, max(0.0, jobs[pending[0]].arrival_s - now)))
            continue
        if service.engine.running_ids:
            result.batch_sizes.append(len(service.engine.running_ids))
        seen = [len(r.chunks) for _, r in submitted]
        driver.step()
        t = time.perf_counter() - t0
        for (i, r), n in zip(submitted, seen, strict=True):
            result.times[i].extend([t] * sum(c.count("\n") for c in r.chunks[n:]))
    result.wall_s = time.perf_counter() - t0
    result.cpu_s = time.process_time() - c0
    result.texts = [""] * len(jobs)
    for i, r in submitted:
        lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
        result.texts[i] = lines[-1].get("generated_text", "") if lines else ""
    return result


def load_hf(model_dir: str) -> tuple[Any, Any]:
    """The same model and tokenizer, loaded plainly with transformers (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, tok


class StepClock:
    """A ``generate()`` streamer that timestamps every decoding step (the first ``put`` is the prompt)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        """Called by ``generate()`` with the prompt, then once per step with the new tokens."""
        if self._prompt_seen:
            self.times.append(time.perf_counter() - self.t0)
        self._prompt_seen = True

    def end(self) -> None:
        """Called at the end of ``generate()``."""


def _cut(row: list[int], eos: set[int], limit: int) -> list[int]:
    out: list[int] = []
    for t in row[:limit]:
        out.append(t)
        if t in eos:
            break
    return out


def _wait_until(t0: float, at: float) -> None:
    delay = at - (time.perf_counter() - t0)
    if delay > 0:
        time.sleep(delay)


def run_sequential(model: Any, tok: Any, jobs: list[Job]) -> RunResult:
    """One ``generate()`` call per request, in arrival order, one after the other."""
    import torch

    eos = {tok.eos_token_id}
    result = RunResult("sequential generate()", arrivals=[j.arrival_s for j in jobs])
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for job in jobs:
            _wait_until(t0, job.arrival_s)
            ids = tok(job.prompt, return_tensors="pt")
            clock = StepClock(t0)
            out = model.generate(**ids, max_new_tokens=job.max_new_tokens, do_sample=False, streamer=clock)
            new = _cut(out[0, ids["input_ids"].shape[1]:].tolist(), eos, job.max_new_tokens)
            result.times.append(clock.times[: len(new)])
            result.texts.append(tok.decode(new, skip_special_tokens=True))
    result.wall_s = time.perf_counter() - t0
    result.cpu_s = time.process_time() - c0
    return result


def run_static(model: Any, tok: Any, jobs: list[Job]) -> RunResult:
    """One left-padded ``generate()`` batch of every request (starts when the last one arrived;
    runs to the largest max_new_tokens; each row is cut at its own limit and first eos)."""
    import torch

    tok.padding_side = "left"
    eos = {tok.eos_token_id}
    result = RunResult("one padded static generate()", arrivals=[j.arrival_s for j in jobs])
    batch = tok([j.prompt for j in jobs], return_tensors="pt", padding=True)
    t0, c0 = time.perf_counter(), time.process_time()
    _wait_until(t0, max(j.arrival_s for j in jobs))
    clock = StepClock(t0)
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=max(j.max_new_tokens for j in jobs), do_sample=False,
                             streamer=clock)
    result.wall_s = time.perf_counter() - t0
    result.cpu_s = time.process_time() - c0
    start = batch["input_ids"].shape[1]
    for row, job in zip(out, jobs, strict=True):
        new = _cut(row[start:].tolist(), eos, job.max_new_tokens)
        result.times.append(clock.times[: len(new)])
        result.texts.append(tok.decode(new, skip_special_tokens=True))
    return result


def ratios(results: dict[str, RunResult]) -> dict[str, float]:
    """Our tok/s over every other mode's."""
    ours = results["rolling"].tok_s
    return {f"rolling / {k}": round(ours / r.tok_s, 2) for k, r in results.items() if k != "rolling" and r.tok_s}


def same_texts(a: RunResult, b: RunResult) -> int:
    """How many requests got identical text in both modes."""
    return sum(x == y for x, y in zip(a.texts, b.texts, strict=True))


def run_benchmark(quick: bool, n: int = 32, rate: float = 1.0, wide: bool = False,
                  skip_sequential: bool = False) -> dict[str, Any]:
    """Both arrival patterns, all three modes; returns the report (tables, ratios, equality)."""
    from benchmarks.workload import mixed_workload
    from djl_handlers.model.embedded import embedded_model_dir

    model_dir = str(embedded_model_dir())
    model, tok = load_hf(model_dir)
    if quick:
        kw: dict[str, Any] = {"n": 8, "prompt_range": (16, 64), "new_range": (8, 24)}
    elif wide:
        kw = {"n": n, "prompt_range": (16, 512), "new_range": (8, 256)}
    else:
        kw = {"n": n}  # the default draw: prompts 16-454 tokens, 12-123 new tokens
    report: dict[str, Any] = {"workload": {k: v for k, v in kw.items()}, "arrivals": {}}
    for label, per_s in (("all at once", 0.0), (f"Poisson {rate}/s", rate)):
        jobs = mixed_workload(tok, rate_per_s=per_s, **kw)
        results = {"rolling": run_rolling(model_dir, jobs), "static": run_static(model, tok, jobs)}
        if not (skip_sequential or (per_s and not quick)):
            results["sequential"] = run_sequential(model, tok, jobs)
        baseline = results.get("sequential") or results["static"]
        report["arrivals"][label] = {
            "prompt_tokens": sum(j.prompt_tokens for j in jobs), "max_new_tokens": sum(j.max_new_tokens for j in jobs),
            "last_arrival_s": rnd(max(j.arrival_s for j in jobs)),
            "results": [r.summary() for r in results.values()],
            "ratios": ratios(results),
            "identical_texts_vs_" + ("sequential" if "sequential" in results else "static"):
                f"{same_texts(results['rolling'], baseline)}/{len(jobs)}",
            "batch_sizes": _histogram(results["rolling"].batch_sizes),
        }
    return report


def _histogram(sizes: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in sizes:
        counts[str(s)] = counts.get(str(s), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def plot(report: dict[str, Any], plt: Any) -> Any:
    """tok/s and TTFT p50 per mode and arrival pattern."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    labels, tok_s, ttft = [], [], []
    for arrival, block in report["arrivals"].items():
        for row in block["results"]:
            labels.append(f"{row['mode'].split(' (')[0]}\n[{arrival}]")
            tok_s.append(row["tok_s"])
            ttft.append(row["ttft_p50_s"] or 0)
    colors = ["#2a7" if "rolling" in lab else "#999" for lab in labels]
    axes[0].barh(labels, tok_s, color=colors)
    axes[0].set_xlabel("generated tokens/s (higher is better)")
    axes[1].barh(labels, ttft, color=colors)
    axes[1].set_xlabel("time to first token p50, s (lower is better)")
    axes[1].set_yticklabels([])
    for ax in axes:
        ax.tick_params(labelsize=7)
    fig.suptitle("Mixed workload, SmolLM2-135M fp32, 2 threads", fontsize=9)
    return fig
