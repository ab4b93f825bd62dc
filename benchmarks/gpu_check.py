"""GPU check of the HF engine (run by ``scripts/gpu_check.sh`` on a CUDA machine).

On the mixed workload (``--n`` requests, all at once), on ``cuda`` in ``--dtype``: the HF engine
(continuous batching) vs one padded static ``generate()`` batch (tok/s, TTFT p50), and each request's tokens vs
``generate()`` of that request alone (all of them up to 64 requests, else every ``n // 32``-th).
``--decode-graphs`` picks the engine's decode step (``option.decode_graphs``: ``off``, the dynamic
shapes; ``cuda_graphs``, captured per bucket; ``compile``; ``static``); the prefill budget is the
engine's default for the device (``prefill_budget.py``: 8192 on an H200) unless ``--max-prefill``.
Exit status 1 when an fp32 run differs from ``generate()`` (fp32 must be exact; bf16 may drift
where two tokens are within rounding, so it is reported, not failed).

The model is ``benchmarks.gpu_model.model_dir()``: ``$DJL_HANDLERS_GPU_MODEL`` (the script sets it,
to a SmolLM2-135M-shaped random model where the embedded one is missing), else the embedded model;
each result names it (``model``). Speed depends on the shapes and the dtype, not on the weights'
values, and fp32 equality with ``generate()`` is a property of the engine, so a random model of the
embedded model's shape measures both as the embedded model would.

    python -m benchmarks.gpu_check --n 32 --dtype bf16 --decode-graphs cuda_graphs
    python -m benchmarks.gpu_check --n 2 --dtype fp32 --device cpu   # the path, on any machine
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.common import context, rnd
from benchmarks.engine_compare import run_engine, run_static
from benchmarks.gpu_model import describe, model_dir
from benchmarks.workload import mixed_workload

PROMPT_MAX = 454  # the mixed workload's longest prompt (tokens)


def alone(model: Any, ids: list[int], n: int, eos: frozenset[int]) -> list[int]:
    """Greedy ``generate()`` of one request, cut at its first eos."""
    import torch

    with torch.inference_mode():
        out = model.generate(torch.tensor([ids], device=model.device), max_new_tokens=n, do_sample=False)
    tokens: list[int] = []
    for t in out[0, len(ids) :].tolist():
        tokens.append(int(t))
        if t in eos:
            break
    return tokens


def references(path: str, model: Any, prompts: list[list[int]], limits: list[int], picks: list[int],
               eos: frozenset[int]) -> dict[int, list[int]]:
    """``alone()`` of each picked request, kept in ``path`` (JSON) when given, so that runs of the same
    ``--n`` and ``--dtype`` with and without graphs compute them once."""
    known: dict[int, list[int]] = {}
    if path and Path(path).exists():
        known = {int(k): v for k, v in json.loads(Path(path).read_text(encoding="utf-8")).items()}
    for i in picks:
        if i not in known:
            known[i] = alone(model, prompts[i], limits[i], eos)
    if path:
        Path(path).write_text(json.dumps(known), encoding="utf-8")
    return known


def check(n: int, dtype: str, device: str, graphs: str = "off", max_prefill: int = 0,
          reference_dir: str = "", prompt_max: int = PROMPT_MAX) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.engines.hf.prefill_budget import default_prefill_tokens

    folder = model_dir()
    tok = AutoTokenizer.from_pretrained(str(folder))
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    model: Any = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype)
    model = model.to(device).eval()
    jobs = mixed_workload(tok, n=n, prompt_range=(16, prompt_max))
    prompts = [tok.encode(j.prompt) for j in jobs]
    limits = [j.max_new_tokens for j in jobs]
    batch = min(n, 256)
    kw = {"max_batch_size": batch, "max_prefill_tokens": max_prefill or default_prefill_tokens(model.device)}

    def engine_of() -> HFEngine:
        built = HFEngine(model, tok, **kw)
        if graphs != "off":
            built.use_decode_graphs(graphs)
        return built

    with torch.inference_mode():
        run_engine(HFEngine(model, tok, **kw), "warm", prompts[:2], [2, 2])
        hf = engine_of()
        t0 = time.perf_counter()
        run_engine(hf, "warm graphs", prompts, limits)  # meets (captures) the buckets of this workload
        warm_s = time.perf_counter() - t0
        engine = run_engine(hf, "HF engine", prompts, limits)
        static = run_static(HFEngine(model, tok, **kw), prompts, limits)
    eos = HFEngine(model, tok).eos_token_ids
    picks = list(range(n)) if n <= 64 else list(range(0, n, max(1, n // 32)))
    t0 = time.perf_counter()
    keep = str(Path(reference_dir) / f"gpu-check-ref-n{n}-{dtype}-{folder.name}.json") if reference_dir else ""
    ref = references(keep, model, prompts, limits, picks, eos)
    same = [engine["token_ids"][i] == ref[i] for i in picks]
    return {
        "model": describe(folder),
        "n": n, "dtype": dtype, "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
        "max_batch_size": batch, "max_prefill_tokens": kw["max_prefill_tokens"], "decode_graphs": graphs,
        "decode_graph_stats": dict(hf.decode_graphs.stats) if hf.decode_graphs is not None else None,
        "engine_warm_run_s": rnd(warm_s),
        "engine": {k: v for k, v in engine.items() if k != "token_ids"},
        "static": {k: v for k, v in static.items() if k != "token_ids"},
        "engine_over_static_tok_s": rnd(engine["tok_s"] / static["tok_s"]) if static["tok_s"] else None,
        "identical_to_generate_alone": f"{sum(same)}/{len(same)}",
        "differing_requests": [i for i, ok in zip(picks, same, strict=True) if not ok],
        "check_s": rnd(time.perf_counter() - t0), "ttft_p50_ratio_static_over_engine":
            rnd((static["ttft_p50_s"] or 0) / engine["ttft_p50_s"]) if engine["ttft_p50_s"] else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--decode-graphs", default="off", choices=("off", "cuda_graphs", "compile", "static"))
    parser.add_argument("--max-prefill", type=int, default=0, help="prefill budget (0: the device's default)")
    parser.add_argument("--prompt-max", type=int, default=PROMPT_MAX,
                        help="longest prompt of the workload (lower it for a model with a short context)")
    parser.add_argument("--reference-dir", default="",
                        help="folder keeping generate()'s tokens between runs of the same --n and --dtype")
    args = parser.parse_args(argv)
    result = {"context": context(), **check(args.n, args.dtype, args.device, args.decode_graphs, args.max_prefill,
                                            args.reference_dir, args.prompt_max)}
    print(json.dumps(result, indent=1), flush=True)
    return 1 if args.dtype == "fp32" and result["differing_requests"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
