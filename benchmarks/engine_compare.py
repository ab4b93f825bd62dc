"""HF engine step paths side by side on the mixed workload, all requests at once, in one process
on one model object per dtype: ``PackedHFEngine`` (``option.hf_step=packed``) vs ``HFEngine``
(``padded``) vs one padded static ``generate()`` batch, optionally transformers' own continuous
batching (``ContinuousBatchingManager``, ``--hf-cb``), and vLLM's offline ``LLM.generate`` on the
same token ids when ``/work/main/.venv-vllm`` exists (a subprocess in that venv; skipped otherwise).

The engines are driven directly (``add_request`` / ``step`` / ``release``, as the scheduler does;
``handle()`` adds < 0.4 % per step, see benchmarks.md §3). Every mode is run ``--repeat`` times,
interleaved (packed, padded, static, packed, ...), so that load drift on a shared box hits each
mode alike; the report keeps each run and the ratios of medians. Equality: each request's token
ids from every mode vs the static batch's (fp32: must be identical).

    python -m benchmarks.engine_compare [--n 32] [--dtype fp32,bf16] [--repeat 2] [--hf-cb]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.common import DOCS, context, pct, rnd, setup_torch
from benchmarks.workload import Job, mixed_workload

VLLM_PY = Path("/work/main/.venv-vllm/bin/python")


def _result(name: str, wall: float, cpu: float, times: list[list[float]], tokens: list[list[int]]) -> dict[str, Any]:
    ttft = [t[0] for t in times if t]
    itl = [b - a for t in times for a, b in zip(t, t[1:], strict=False)]
    n = sum(len(t) for t in tokens)
    return {"mode": name, "wall_s": rnd(wall), "tokens": n, "tok_s": rnd(n / wall, 1),
            "tok_per_cpu_s": rnd(n / cpu, 1) if cpu else None,
            "ttft_p50_s": rnd(pct(ttft, 0.5)), "ttft_p99_s": rnd(pct(ttft, 0.99)),
            "itl_p50_ms": rnd(1000 * (pct(itl, 0.5) or 0), 1), "itl_p99_ms": rnd(1000 * (pct(itl, 0.99) or 0), 1),
            "token_ids": tokens}


def run_engine(engine: Any, name: str, prompts: list[list[int]], limits: list[int]) -> dict[str, Any]:
    """All requests at once through ``engine``; each released at its limit or eos."""
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.params.generation import GenerationParameters

    eos = engine.eos_token_ids
    tokens: list[list[int]] = [[] for _ in prompts]
    times: list[list[float]] = [[] for _ in prompts]
    t0, c0 = time.perf_counter(), time.process_time()
    for i, (ids, n) in enumerate(zip(prompts, limits, strict=True)):
        engine.add_request(EngineRequest(i, ids, GenerationParameters(max_new_tokens=n)))
    while engine.has_unfinished():
        outs = engine.step()
        now = time.perf_counter() - t0
        for out in outs:
            i = out.request_id
            if out.error is not None:
                raise RuntimeError(out.error)
            tokens[i].append(int(out.token_id))
            times[i].append(now)
            if len(tokens[i]) >= limits[i] or out.token_id in eos:
                engine.release(i)
    return _result(name, time.perf_counter() - t0, time.process_time() - c0, times, tokens)


def run_static(engine: Any, prompts: list[list[int]], limits: list[int]) -> dict[str, Any]:
    """One left-padded ``generate()`` batch (the engine's dynamic-batch path, one group)."""
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.params.generation import GenerationParameters

    reqs = [EngineRequest(i, ids, GenerationParameters(max_new_tokens=n))
            for i, (ids, n) in enumerate(zip(prompts, limits, strict=True))]
    t0, c0 = time.perf_counter(), time.process_time()
    outs = engine.generate_static(reqs)
    wall = time.perf_counter() - t0
    tokens = [[int(o.token_id) for o in row] for row in outs]
    times = [[wall] * len(t) for t in tokens]  # every token is returned at the end of the call
    return _result("static generate() (one padded batch)", wall, time.process_time() - c0, times, tokens)


def run_hf_cb(model: Any, prompts: list[list[int]], limits: list[int], eos: set[int]) -> dict[str, Any]:
    """transformers' own continuous batching (paged KV, its scheduler thread), per-request limits."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max(limits), eos_token_id=sorted(eos))
    t0, c0 = time.perf_counter(), time.process_time()
    manager = model.init_continuous_batching(generation_config=config)
    manager.start()
    ids = [manager.add_request(p, max_new_tokens=n) for p, n in zip(prompts, limits, strict=True)]
    results: dict[str, Any] = {}
    while len(results) < len(ids):
        out = manager.get_result(timeout=1)
        if out is not None and out.is_finished():
            results[out.request_id] = out
    manager.stop(block=True)
    wall = time.perf_counter() - t0
    tokens = [list(results[i].generated_tokens) for i in ids]
    times = [[wall] * len(t) for t in tokens]  # TTFT not measured for this mode
    return _result("transformers ContinuousBatchingManager", wall, time.process_time() - c0, times, tokens)


def compare(n: int, dtype: str, repeat: int, hf_cb: bool, max_prefill: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.engines.hf_engine import HFEngine
    from djl_handlers.engines.hf_packed import PackedHFEngine
    from djl_handlers.model.embedded import embedded_model_dir

    model_dir = str(embedded_model_dir())
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, {"fp32": "float32",
                                                                              "bf16": "bfloat16"}[dtype])).eval()
    jobs: list[Job] = mixed_workload(tok, n=n)
    prompts = [tok.encode(j.prompt) for j in jobs]
    limits = [j.max_new_tokens for j in jobs]
    kw = {"max_batch_size": 32, "max_prefill_tokens": max_prefill}
    modes: dict[str, Any] = {
        "packed": lambda: run_engine(PackedHFEngine(model, tok, **kw), "HF packed (hf_step=packed)", prompts, limits),
        "padded": lambda: run_engine(HFEngine(model, tok, **kw), "HF padded (ours, default)", prompts, limits),
        "static": lambda: run_static(HFEngine(model, tok, **kw), prompts, limits),
    }
    if hf_cb:
        modes["hf_cb"] = lambda: run_hf_cb(model, prompts, limits, set(HFEngine(model, tok).eos_token_ids))
    with torch.inference_mode():  # warm-up: one short request per engine path
        run_engine(PackedHFEngine(model, tok, **kw), "warm", prompts[:2], [2, 2])
        run_engine(HFEngine(model, tok, **kw), "warm", prompts[:2], [2, 2])
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in modes}
    loads = [os.getloadavg()[0]]
    for _ in range(repeat):
        for key, fn in modes.items():
            runs[key].append(fn())
            loads.append(os.getloadavg()[0])
            last = {k: v for k, v in runs[key][-1].items() if k != "token_ids"}
            print("run", dtype, json.dumps(last), "load", round(loads[-1], 2), flush=True)
    reference = runs["static"][0]["token_ids"]
    summary: dict[str, Any] = {"dtype": dtype, "prompt_tokens": sum(len(p) for p in prompts),
                               "loadavg_1m_during": [round(x, 2) for x in loads], "modes": {}}
    for key, rs in runs.items():
        med = sorted(rs, key=lambda r: r["tok_s"])[len(rs) // 2]
        summary["modes"][key] = {
            **{k: v for k, v in med.items() if k != "token_ids"},
            "tok_s_runs": [r["tok_s"] for r in rs],
            "identical_to_static": f"{sum(a == b for a, b in zip(med['token_ids'], reference, strict=True))}/{n}",
        }
    tps = {k: v["tok_s"] for k, v in summary["modes"].items()}
    summary["ratios"] = {f"packed / {k}": round(tps["packed"] / v, 2) for k, v in tps.items() if k != "packed" and v}
    vllm = vllm_subprocess(model_dir, dtype, prompts, limits)
    if isinstance(vllm, dict) and "tok_s" in vllm:
        ids = vllm.pop("token_ids")
        vllm["identical_to_static"] = f"{sum(a == b for a, b in zip(ids, reference, strict=True))}/{n}"
        summary["ratios"]["packed / vllm"] = round(tps["packed"] / vllm["tok_s"], 2)
    summary["vllm"] = vllm
    return summary


_VLLM_SCRIPT = """
import json, sys, time
from vllm import LLM, SamplingParams
job = json.load(sys.stdin)
llm = LLM(model=job["model"], dtype=job["dtype"], max_num_seqs=32, enforce_eager=True)
params = [SamplingParams(max_tokens=n, temperature=0.0) for n in job["limits"]]
prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
llm.generate(prompts[:2], params[:2], use_tqdm=False)
t0 = time.perf_counter()
outs = llm.generate(prompts, params, use_tqdm=False)
wall = time.perf_counter() - t0
tokens = [list(o.outputs[0].token_ids) for o in outs]
print(json.dumps({"mode": "vLLM LLM.generate", "wall_s": wall, "tokens": sum(map(len, tokens)),
                  "tok_s": sum(map(len, tokens)) / wall, "token_ids": tokens}))
"""


def vllm_subprocess(model_dir: str, dtype: str, prompts: list[list[int]], limits: list[int]) -> dict[str, Any] | str:
    """vLLM's offline ``LLM.generate`` on the same token ids, in its own venv (vLLM and our torch
    cannot share one); a note when that venv does not exist."""
    if not VLLM_PY.exists():
        return f"skipped: {VLLM_PY.parent.parent} does not exist (scripts/setup_vllm_cpu.sh creates it)"
    job = {"model": model_dir, "dtype": {"fp32": "float32", "bf16": "bfloat16"}[dtype], "prompts": prompts,
           "limits": limits}
    out = subprocess.run([str(VLLM_PY), "-c", _VLLM_SCRIPT], input=json.dumps(job), capture_output=True,
                         text=True, check=False, timeout=3600)
    try:
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return f"failed: {out.stderr[-1500:]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--dtype", default="fp32,bf16")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-prefill", type=int, default=512)
    parser.add_argument("--hf-cb", action="store_true", help="also run transformers' ContinuousBatchingManager")
    parser.add_argument("--out", default=str(DOCS / "benchmarks-engine-compare.json"))
    args = parser.parse_args(argv)
    setup_torch()
    report: dict[str, Any] = {"context_start": context(), "n": args.n, "max_prefill_tokens": args.max_prefill,
                              "runs": []}
    for dtype in args.dtype.split(","):
        block = compare(args.n, dtype, args.repeat, args.hf_cb, args.max_prefill)
        report["runs"].append(block)
        print(json.dumps({k: v for k, v in block.items()}, indent=1), flush=True)
    report["context_end"] = context()
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
