"""HF engine step paths side by side on the mixed workload, all requests at once, in one process
on one model object per dtype: ``HFEngine`` (with its CPU kernels, or torch's attention or linear
layers) vs one padded static ``generate()`` batch, optionally transformers' own continuous
batching (``ContinuousBatchingManager``, ``--hf-cb``), and vLLM's offline ``LLM.generate`` on the
same token ids when the checkout's ``.venv-vllm`` exists (a subprocess in that venv; skipped otherwise).

The engines are driven directly (``add_request`` / ``step`` / ``release``, as the scheduler does;
``handle()`` adds < 0.4 % per step: docs/benchmarks.md, "Per-step overhead"). Every mode is run
``--repeat`` times, interleaved (padded, padded-sdpa, static, padded, ...), so that load drift on a
shared box hits each mode alike; the report keeps each run and the ratios of medians. Equality: each request's token
ids from every mode vs the static batch's (fp32: must be identical).

    python -m benchmarks.engine_compare [--n 32] [--dtype fp32,bf16] [--repeat 2] [--hf-cb]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, THREADS, context, pct, result_path, rnd, setup_torch
from benchmarks.workload import Job, mixed_workload

VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"


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


def _use_kernels(model: Any, linear: str, attention: str = "ragged") -> None:
    """Switch ``model``'s linear layers between oneDNN-prepacked with fused projections (``onednn``,
    the engine's default) and torch's own, and its attention between the ragged kernel (``ragged``)
    and torch's SDPA. RMSNorms and the rotary embedding use their kernels (the engine's default)
    unless both are torch's (the stock model)."""
    from djl_handlers.config.hf import HuggingFaceOptions
    from djl_handlers.engines.hf.cpu import patches

    kernels = "torch" if (linear, attention) == ("torch", "sdpa") else "fused"
    patches.revert(model)
    # with onednn: fused projections too (q/k/v, gate/up, SiLU·mul), the engine's default
    patches.apply(model, HuggingFaceOptions(cpu_linear=linear, cpu_attention=attention, cpu_norm=kernels,
                                            cpu_rotary=kernels))  # ragged: the kernel or a ConfigError


def _kernels_of(mode: str) -> tuple[str, str]:
    """(linear, attention) kinds a mode runs with: the engine's defaults unless its name says."""
    if mode in ("hf_cb", "static-stock"):  # stock transformers: none of our kernels
        return "torch", "sdpa"
    return ("torch" if mode.endswith("-torch") else "onednn"), ("sdpa" if mode.endswith("-sdpa") else "ragged")


def run_sequential(model: Any, prompts: list[list[int]], limits: list[int], eos: set[int]) -> dict[str, Any]:
    """Each request alone through ``model.generate()`` (greedy): the fp32 reference."""
    import torch

    tokens: list[list[int]] = []
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for ids, n in zip(prompts, limits, strict=True):
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, eos_token_id=sorted(eos),
                                 pad_token_id=sorted(eos)[0])
            new = out[0, len(ids):].tolist()
            cut = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
            tokens.append(new[:cut])
    wall = time.perf_counter() - t0
    times = [[wall] * len(t) for t in tokens]
    return _result("sequential generate()", wall, time.process_time() - c0, times, tokens)


def compare(n: int, dtype: str, repeat: int, hf_cb: bool, max_prefill: int, modes: list[str],
            with_sequential: bool) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.model.embedded import embedded_model_dir

    model_dir = str(embedded_model_dir())
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, {"fp32": "float32",
                                                                              "bf16": "bfloat16"}[dtype])).eval()
    jobs: list[Job] = mixed_workload(tok, n=n)
    prompts = [tok.encode(j.prompt) for j in jobs]
    limits = [j.max_new_tokens for j in jobs]
    kw = {"max_batch_size": 32, "max_prefill_tokens": max_prefill}
    all_modes: dict[str, Any] = {
        "padded": lambda: run_engine(HFEngine(model, tok, **kw), "HF padded (ours, default)", prompts, limits),
        "padded-sdpa": lambda: run_engine(HFEngine(model, tok, **kw), "HF padded, cpu_attention=sdpa", prompts, limits),
        "padded-torch": lambda: run_engine(HFEngine(model, tok, **kw), "HF padded, cpu_linear=torch", prompts, limits),
        "static": lambda: run_static(HFEngine(model, tok, **kw), prompts, limits),
        "static-stock": lambda: {**run_static(HFEngine(model, tok, **kw), prompts, limits),
                                 "mode": "one padded static generate(), stock transformers"},
        "hf_cb": lambda: run_hf_cb(model, prompts, limits, set(HFEngine(model, tok).eos_token_ids)),
    }
    wanted = [m for m in modes if m != "hf_cb"] + (["hf_cb"] if hf_cb else [])
    chosen = {k: all_modes[k] for k in wanted}
    with torch.inference_mode():  # warm-up: one short request per engine path and kernel kind
        for linear, attention in (("onednn", "ragged"), ("onednn", "sdpa"), ("torch", "ragged")):
            _use_kernels(model, linear, attention)
            run_engine(HFEngine(model, tok, **kw), "warm", prompts[:2], [2, 2])
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in chosen}
    loads = [os.getloadavg()[0]]
    for _ in range(repeat):
        for key, fn in chosen.items():
            _use_kernels(model, *_kernels_of(key))
            runs[key].append(fn())
            loads.append(os.getloadavg()[0])
            last = {k: v for k, v in runs[key][-1].items() if k != "token_ids"}
            print("run", dtype, json.dumps(last), "load", round(loads[-1], 2), flush=True)
    sequential = None
    if with_sequential and dtype == "fp32":  # the exactness reference (bf16 tokens may differ by rounding)
        _use_kernels(model, "onednn", "sdpa")  # torch's attention: the reference is not our kernel
        sequential = run_sequential(model, prompts, limits, set(HFEngine(model, tok).eos_token_ids))
        print("run", dtype, json.dumps({k: v for k, v in sequential.items() if k != "token_ids"}), flush=True)
    _use_kernels(model, "torch", "sdpa")
    first = runs["static"][0] if "static" in runs else next(iter(runs.values()))[0]
    reference = (sequential or first)["token_ids"]
    summary: dict[str, Any] = {"dtype": dtype, "prompt_tokens": sum(len(p) for p in prompts),
                               "loadavg_1m_during": [round(x, 2) for x in loads], "modes": {}}
    for key, rs in runs.items():
        med = sorted(rs, key=lambda r: r["tok_s"])[len(rs) // 2]
        summary["modes"][key] = {
            **{k: v for k, v in med.items() if k != "token_ids"},
            "tok_s_runs": [r["tok_s"] for r in rs],
            "identical_to_reference": f"{sum(a == b for a, b in zip(med['token_ids'], reference, strict=True))}/{n}",
        }
    tps = {k: v["tok_s"] for k, v in summary["modes"].items()}
    summary["reference"] = "sequential generate()" if sequential else "static generate()"
    if sequential:
        summary["modes"]["sequential"] = {k: v for k, v in sequential.items() if k != "token_ids"}
        tps["sequential"] = sequential["tok_s"]
    head = "padded" if "padded" in tps else next(iter(tps))
    summary["ratios"] = {f"{head} / {k}": round(tps[head] / v, 2) for k, v in tps.items() if k != head and v}
    vllm = vllm_subprocess(model_dir, dtype, prompts, limits)
    if isinstance(vllm, dict) and "tok_s" in vllm:
        ids = vllm.pop("token_ids")
        vllm["identical_to_reference"] = f"{sum(a == b for a, b in zip(ids, reference, strict=True))}/{n}"
        summary["ratios"][f"{head} / vllm"] = round(tps[head] / vllm["tok_s"], 2)
    summary["vllm"] = vllm
    return summary


# vLLM V1 starts its engine core with multiprocessing "spawn": the script needs a main guard.
_VLLM_SCRIPT = """
import json, sys, time

def main():
    from vllm import LLM, SamplingParams
    job = json.load(open(sys.argv[1]))
    llm = LLM(model=job["model"], dtype=job["dtype"], max_num_seqs=32, enforce_eager=True,
              gpu_memory_utilization=0.3, max_model_len=2048)
    params = [SamplingParams(max_tokens=n, temperature=0.0) for n in job["limits"]]
    prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    print("RESULT " + json.dumps({"mode": "vLLM LLM.generate", "wall_s": wall, "tokens": sum(map(len, tokens)),
                      "tok_s": sum(map(len, tokens)) / wall, "token_ids": tokens}))

if __name__ == "__main__":
    main()
"""


def vllm_subprocess(model_dir: str, dtype: str, prompts: list[list[int]], limits: list[int]) -> dict[str, Any] | str:
    """vLLM's offline ``LLM.generate`` on the same token ids, in its own venv (vLLM and our torch
    cannot share one); a note when that venv does not exist."""
    if not VLLM_PY.exists():
        return f"skipped: {VLLM_PY.parent.parent} does not exist (scripts/setup_vllm_cpu.sh creates it)"
    job = {"model": model_dir, "dtype": {"fp32": "float32", "bf16": "bfloat16"}[dtype], "prompts": prompts,
           "limits": limits}
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": str(THREADS), "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        script, data = Path(tmp, "vllm_generate.py"), Path(tmp, "job.json")
        script.write_text(_VLLM_SCRIPT)
        data.write_text(json.dumps(job))
        out = subprocess.run([str(VLLM_PY), str(script), str(data)], capture_output=True, text=True, check=False,
                             timeout=3600, env=env)
    found = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]  # vLLM logs to stdout too
    if not found:
        return f"failed (exit {out.returncode}): {out.stderr[-1500:]}"
    return dict(json.loads(found[-1][len("RESULT "):]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--dtype", default="fp32,bf16")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-prefill", type=int, default=512)
    parser.add_argument("--hf-cb", action="store_true", help="also run transformers' ContinuousBatchingManager")
    parser.add_argument("--modes", default="padded,padded-sdpa,padded-torch,static",
                        help="comma list of padded, padded-sdpa (cpu_attention=sdpa), padded-torch "
                             "(cpu_linear=torch), static (same model object: our kernels), static-stock "
                             "(stock transformers)")
    parser.add_argument("--sequential", action="store_true", help="also each request alone through generate(): "
                        "the reference for token equality (else the static batch)")
    parser.add_argument("--out", help="report path (default: benchmarks/results/engine-compare.json)")
    args = parser.parse_args(argv)
    setup_torch()
    report: dict[str, Any] = {"context_start": context(), "n": args.n, "max_prefill_tokens": args.max_prefill,
                              "runs": []}
    for dtype in args.dtype.split(","):
        block = compare(args.n, dtype, args.repeat, args.hf_cb, args.max_prefill, args.modes.split(","),
                        args.sequential)
        report["runs"].append(block)
        print(json.dumps({k: v for k, v in block.items()}, indent=1), flush=True)
    report["context_end"] = context()
    out = Path(args.out) if args.out else result_path("engine-compare")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
