"""GPU check of the HF engine (run by ``scripts/gpu_check.sh`` on a CUDA machine).

On the mixed workload (``--n`` requests, all at once), on ``cuda`` in ``--dtype``: the HF engine
(continuous batching) vs one padded static ``generate()`` batch (tok/s, TTFT p50), and each request's tokens vs
``generate()`` of that request alone (all of them up to 64 requests, else every ``n // 32``-th).
Exit status 1 when an fp32 run differs from ``generate()`` (fp32 must be exact; bf16 may drift
where two tokens are within rounding, so it is reported, not failed).

    python -m benchmarks.gpu_check --n 32 --dtype bf16
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from benchmarks.common import context, rnd
from benchmarks.engine_compare import run_engine, run_static
from benchmarks.workload import mixed_workload


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


def check(n: int, dtype: str, device: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.model.embedded import embedded_model_dir

    model_dir = str(embedded_model_dir())
    tok = AutoTokenizer.from_pretrained(model_dir)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
    model = model.to(device).eval()
    jobs = mixed_workload(tok, n=n)
    prompts = [tok.encode(j.prompt) for j in jobs]
    limits = [j.max_new_tokens for j in jobs]
    batch = min(n, 256)
    kw = {"max_batch_size": batch, "max_prefill_tokens": 2048}
    with torch.inference_mode():
        run_engine(HFEngine(model, tok, **kw), "warm", prompts[:2], [2, 2])
        engine = run_engine(HFEngine(model, tok, **kw), "HF engine", prompts, limits)
        static = run_static(HFEngine(model, tok, **kw), prompts, limits)
    eos = HFEngine(model, tok).eos_token_ids
    picks = list(range(n)) if n <= 64 else list(range(0, n, max(1, n // 32)))
    t0 = time.perf_counter()
    same = [engine["token_ids"][i] == alone(model, prompts[i], limits[i], eos) for i in picks]
    return {
        "n": n, "dtype": dtype, "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
        "max_batch_size": batch,
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
    args = parser.parse_args(argv)
    result = {"context": context(), **check(args.n, args.dtype, args.device)}
    print(json.dumps(result, indent=1), flush=True)
    return 1 if args.dtype == "fp32" and result["differing_requests"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
