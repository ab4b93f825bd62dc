"""The ragged attention kernel's vector path (AVX-512 or AVX2, whichever this CPU has) against its
plain C path, side by side in one process.

The kernel's source has three paths: AVX-512 intrinsics, AVX2 intrinsics, and plain C that gcc
vectorises as it can. A CPU runs the best its flags allow; before the AVX2 path existed, every CPU
without AVX-512 ran the plain C one. Both libraries are built here for this CPU (``-march=native``;
the plain one with ``-DDJL_PLAIN_C``, which leaves the intrinsics out) and the model's calls are
switched between them:

1. the op: 30 layers of one decode step (32 rows, SmolLM2-135M's 9 query / 3 key-value heads of
   64, 384 cached columns, each layer's keys and values distinct, so they come from memory as in a
   real step) and 30 layers of a 512-token prefill chunk holding 2 prompts of 256;
2. the engine: the embedded SmolLM2-135M in the HF engine with its served CPU patches, 32 prompts
   of 256 random tokens, 128 new tokens each, all queued at once (the shape of the llama.cpp and
   vLLM comparisons' workload, without HTTP); total tokens per second, the path alternating run by
   run, each run a fresh engine on the same model object, after one uncounted warm-up run.

    python -m benchmarks.attention_paths [--rounds 2] [--dtype fp32] [--quick]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.common import context, median, print_table, rnd, setup_torch, write_report

PLAIN = ("-DDJL_PLAIN_C",)


def libraries() -> dict[str, Any]:
    """``{"vector": fn, "plain": fn}``: the kernel function of the native build and of the same
    build with the intrinsics left out."""
    from djl_handlers.kernels import build
    from djl_handlers.kernels import decode_attention as da

    native = da.library()
    if native is None:
        raise SystemExit(f"the attention kernel cannot be built here: {da.unavailable_reason()}")
    plain = build._build_and_load(da.NAME, PLAIN).djl_decode_attention
    plain.argtypes, plain.restype = native.argtypes, native.restype
    return {"vector": native, "plain": plain}


def use(fn: Any) -> None:
    """Route every later kernel call of this process to ``fn``."""
    from djl_handlers.kernels import decode_attention as da

    da._fn = fn


def op_times(fns: dict[str, Any], dtype: Any, rounds: int) -> list[dict[str, Any]]:
    import torch

    from djl_handlers.kernels.decode_attention import attention

    layers, rows_out = 30, []
    cases = {"decode, 32 rows x 384 columns": (32, 1, 384), "prefill chunk, 2 prompts x 256": (2, 256, 256)}
    for name, (rows, queries, width) in cases.items():
        gen = torch.Generator().manual_seed(0)
        keys = [torch.randn(rows, 3, width, 64, generator=gen).to(dtype) for _ in range(layers)]
        values = [torch.randn(rows, 3, width, 64, generator=gen).to(dtype) for _ in range(layers)]
        query = torch.randn(rows, 9, queries, 64, generator=gen).to(dtype)
        starts = torch.zeros(rows, dtype=torch.int64)
        outs, best = {}, {k: float("inf") for k in fns}
        for _ in range(rounds * 2):
            for path, fn in fns.items():
                use(fn)
                t0 = time.perf_counter()
                for layer in range(layers):
                    outs[path] = attention(query, keys[layer], values[layer], starts, 0.125)
                best[path] = min(best[path], time.perf_counter() - t0)
        diff = (outs["vector"].float() - outs["plain"].float()).abs().max().item()
        rows_out.append({"case": name, "plain_ms": rnd(best["plain"] * 1e3, 1),
                         "vector_ms": rnd(best["vector"] * 1e3, 1), "speedup": rnd(best["plain"] / best["vector"]),
                         "max_abs_diff": f"{diff:.1e}"})
    return rows_out


def engine_runs(fns: dict[str, Any], dtype: Any, rounds: int, prompts: int, new_tokens: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.config.hf import HuggingFaceOptions
    from djl_handlers.engines.base import EngineRequest
    from djl_handlers.engines.hf.cpu import patches
    from djl_handlers.engines.hf.engine import HFEngine
    from djl_handlers.model.embedded import embedded_model_dir
    from djl_handlers.params.generation import GenerationParameters

    folder = str(embedded_model_dir())
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    applied = patches.apply(model, HuggingFaceOptions())
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(100, 40000, (256,), generator=gen).tolist() for _ in range(prompts)]

    def run(fn: Any) -> tuple[float, list[list[int]]]:
        use(fn)
        engine = HFEngine(model, tok, max_batch_size=32, max_prefill_tokens=512)
        for i, prompt in enumerate(ids):
            engine.add_request(EngineRequest(i, prompt, GenerationParameters(max_new_tokens=new_tokens)))
        tokens: list[list[int]] = [[] for _ in ids]
        t0 = time.perf_counter()
        while any(len(t) < new_tokens for t in tokens):
            for out in engine.step():
                tokens[out.request_id].append(out.token_id)
                if len(tokens[out.request_id]) == new_tokens:
                    engine.release(out.request_id)
        return time.perf_counter() - t0, tokens

    tok_s: dict[str, list[float]] = {path: [] for path in fns}
    texts: dict[str, list[list[int]]] = {}
    run(fns["vector"])  # warm-up, not counted: the first engine of a process is slower (allocations)
    for r in range(rounds):
        for path in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            seconds, texts[path] = run(fns[path])
            tok_s[path].append(prompts * new_tokens / seconds)
            print(f"round {r + 1} {path}: {tok_s[path][-1]:.1f} tok/s", flush=True)
    ratios = [v / p for v, p in zip(tok_s["vector"], tok_s["plain"], strict=True)]
    agree = sum(a == b for a, b in zip(texts["vector"], texts["plain"], strict=True))
    return {"patches": applied, "prompts": prompts, "prompt_tokens": 256, "new_tokens": new_tokens,
            "tok_s": {k: [rnd(x, 1) for x in v] for k, v in tok_s.items()},
            "ratio_per_round": [rnd(x) for x in ratios], "ratio_median": rnd(median(ratios)),
            "greedy_texts_equal": f"{agree}/{prompts}"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--quick", action="store_true", help="8 prompts, 32 new tokens, one round")
    args = parser.parse_args(argv)
    setup_torch()
    import torch

    from djl_handlers.engines.hf.cpu import isa

    started = context()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    fns = libraries()
    rounds = 1 if args.quick else args.rounds
    with torch.inference_mode():
        ops = op_times(fns, dtype, rounds)
        print_table(ops, ["case", "plain_ms", "vector_ms", "speedup", "max_abs_diff"],
                    f"30 layers of attention, {args.dtype}")
        engine = engine_runs(fns, dtype, rounds, 8 if args.quick else 32, 32 if args.quick else 128)
    print(f"engine, {args.dtype}: vector / plain tok/s per round {engine['ratio_per_round']}, "
          f"median {engine['ratio_median']}; greedy texts equal {engine['greedy_texts_equal']}")
    cpu = isa.features()
    write_report("attention-paths", {"dtype": args.dtype, "cpu": {"model": cpu.model, "isa": cpu.isa},
                                     "ops": ops, "engine": engine}, args.quick, started)


if __name__ == "__main__":
    main()
