"""Decode attention over real tokens (``option.cpu_attention``) vs torch's SDPA, side by side.

Three measurements, each alternated round by round in one process so the shared box's drift hits
both alike:

1. the attention op alone: 30 layers of one decode step (32 rows, SmolLM2-135M's 9 query / 3
   key-value heads of 64, a left-padded cache of ``--width`` columns whose rows hold 16..width real
   tokens, keys/values as views into a larger slab like the engine's), SDPA with the padding mask
   vs the kernel;
2. 30 layers of a prompt's attention: one 512-token prompt (SDPA with ``is_causal``, as
   transformers calls it without padding) and a group of 4 prompts of up to 128 tokens padded by
   <= 12.5 % (SDPA with the explicit mask);
3. whole decode steps of the HF engine on the embedded SmolLM2-135M after the 32 prompts of the
   mixed workload are prefilled (the batch's real width and padding), with the model's attention
   switched between SDPA and the kernel every few steps.

    python -m benchmarks.decode_attention [--dtype fp32,bf16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.common import RESULTS, per_dtype_main, rnd


def _best(times: list[float]) -> float:
    return min(times) * 1e3


def op_alone(dtype: Any, width: int, rounds: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from djl_handlers.kernels.decode_attention import decode_attention

    torch.manual_seed(0)
    rows, heads, kv_heads, dim, layers = 32, 9, 3, 64, 30
    lengths = torch.randint(16, width + 1, (rows,))
    lengths[0] = width
    starts = (width - lengths).to(torch.int64)
    mask = (torch.arange(width)[None, :] >= starts[:, None]).view(rows, 1, 1, width)
    cache = [(torch.randn(rows + 8, kv_heads, width + 128, dim, dtype=dtype)[:rows, :, 64 : 64 + width],
              torch.randn(rows + 8, kv_heads, width + 128, dim, dtype=dtype)[:rows, :, 64 : 64 + width])
             for _ in range(layers)]
    query = torch.randn(rows, 1, heads, dim, dtype=dtype).transpose(1, 2)  # [B, H, 1, D] as HF passes it

    def sdpa() -> None:
        packed = query.reshape(rows, kv_heads, heads // kv_heads, dim)
        for k, v in cache:
            F.scaled_dot_product_attention(packed, k, v, attn_mask=mask, scale=dim**-0.5)

    def kernel() -> None:
        for k, v in cache:
            decode_attention(query[:, :, 0], k, v, starts, dim**-0.5)

    times: dict[str, list[float]] = {"sdpa": [], "kernel": []}
    kernel()
    sdpa()
    for _ in range(rounds):
        for name, fn in (("sdpa", sdpa), ("kernel", kernel)):
            t0 = time.perf_counter()
            for _ in range(5):
                fn()
            times[name].append((time.perf_counter() - t0) / 5)
    real = float(lengths.sum()) / (rows * width)
    return {"rows": rows, "width": width, "real_fraction": rnd(real), "sdpa_ms": rnd(_best(times["sdpa"]), 1),
            "kernel_ms": rnd(_best(times["kernel"]), 1),
            "speedup": rnd(_best(times["sdpa"]) / _best(times["kernel"]))}


def prompt_alone(dtype: Any, rows: int, tokens: int, padded: bool, rounds: int) -> dict[str, Any]:
    """30 layers of a prefill: ``rows`` prompts of up to ``tokens`` tokens, SDPA as transformers
    calls it (grouped heads repeated; ``is_causal`` without padding, else the explicit mask) vs
    the kernel."""
    import torch
    import torch.nn.functional as F

    from djl_handlers.kernels.decode_attention import attention

    torch.manual_seed(0)
    heads, kv_heads, dim, layers = 9, 3, 64, 30
    starts = torch.zeros(rows, dtype=torch.int64)
    if padded:
        starts = torch.randint(0, tokens // 8 + 1, (rows,))  # <= 12.5 % padding, like the engine's groups
        starts[0] = 0
    columns = torch.arange(tokens)
    mask = ((columns[None, None, :] >= starts[:, None, None]) & (columns[None, None, :] <= columns[None, :, None]))
    mask = mask | ~mask.any(dim=-1, keepdim=True)  # SDPA's builder unmasks the rows of padding queries
    query = torch.randn(rows, tokens, heads, dim, dtype=dtype).transpose(1, 2)
    cache = [tuple(torch.randn(rows, kv_heads, tokens, dim, dtype=dtype) for _ in "kv") for _ in range(layers)]

    def sdpa() -> None:
        for k, v in cache:
            k2, v2 = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
            if padded:
                F.scaled_dot_product_attention(query, k2, v2, attn_mask=mask[:, None], scale=dim**-0.5)
            else:
                F.scaled_dot_product_attention(query, k2, v2, is_causal=True, scale=dim**-0.5)

    def kernel() -> None:
        for k, v in cache:
            attention(query, k, v, starts, dim**-0.5)

    times: dict[str, list[float]] = {"sdpa": [], "kernel": []}
    kernel()
    sdpa()
    for _ in range(rounds):
        for name, fn in (("sdpa", sdpa), ("kernel", kernel)):
            t0 = time.perf_counter()
            for _ in range(2):
                fn()
            times[name].append((time.perf_counter() - t0) / 2)
    return {"rows": rows, "tokens": tokens, "padded": padded, "sdpa_ms": rnd(_best(times["sdpa"]), 1),
            "kernel_ms": rnd(_best(times["kernel"]), 1), "speedup": rnd(_best(times["sdpa"]) / _best(times["kernel"]))}


def engine_steps(dtype: Any, rounds: int) -> dict[str, Any]:
    from benchmarks.workload import decoding_engine
    from djl_handlers.engines.hf.cpu import ragged_attention
    from djl_handlers.engines.hf.cpu.linear import prepack_linears

    model, engine = decoding_engine(dtype, prepack_linears)
    batch = engine._batch
    assert batch is not None
    shape = {"rows": len(batch.rows), "width": batch.width, "real_fraction": rnd(float(batch.mask.float().mean()))}
    times: dict[str, list[float]] = {"sdpa": [], "kernel": []}
    for _ in range(rounds):
        for name in ("sdpa", "kernel"):
            ragged_attention.disable(model)
            if name == "kernel" and not ragged_attention.enable(model):
                raise SystemExit("the decode attention kernel cannot be built here")
            engine.step()  # one untimed step after the switch
            t0 = time.perf_counter()
            for _ in range(4):
                engine.step()
            times[name].append((time.perf_counter() - t0) / 4)
    return {**shape, "steps_per_round": 4, "sdpa_ms": rnd(_best(times["sdpa"]), 1),
            "kernel_ms": rnd(_best(times["kernel"]), 1), "speedup": rnd(_best(times["sdpa"]) / _best(times["kernel"]))}


def _measure(dtype: Any, args: argparse.Namespace) -> dict[str, Any]:
    return {"op_alone": op_alone(dtype, args.width, args.rounds),
            "prompt_512": prompt_alone(dtype, 1, 512, False, args.rounds),
            "prompt_group_4x128_padded": prompt_alone(dtype, 4, 128, True, args.rounds),
            "engine_decode_step": engine_steps(dtype, args.rounds)}


def main(argv: list[str] | None = None) -> None:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--width", type=int, default=465, help="padded width of the op-alone cache")

    per_dtype_main(__doc__ or "", argv, RESULTS / "decode-attention.json", 3, _measure, options)


if __name__ == "__main__":
    main()
