"""The fused projections (``option.cpu_fuse_projections``, with the MLP's SiLU·mul kernel) and the
argmax / log-sum-exp kernel (``kernels/row_stats``), each against the path it replaces, side by
side in one process.

1. the five projections of one decoder layer (q, k, v, gate, up of SmolLM2-135M: 576 inputs; 576,
   192, 192, 1536, 1536 outputs) at 16 and 32 rows: five prepacked oneDNN GEMMs vs two fused ones;
2. SiLU·mul of the MLP at 16, 32 and 512 rows: torch's ``silu(gate) * up`` on the fused output's
   slices vs the kernel;
3. the rotary embedding of one layer (9 query / 3 key-value heads of 64, strided like the fused
   projection's slices) for a 32-row decode step, a 512-token prompt and 4 prompts of 128: torch's
   ``apply_rotary_pos_emb`` vs the kernel;
4. the logits pass of a decode step at 16 and 32 rows (49,152 columns): torch's ``float()``,
   ``argmax``, ``logsumexp`` and ``gather`` (what ``sample_batch`` ran before) vs the kernel;
5. whole decode steps of the HF engine on the embedded model after the 32 prompts of the mixed
   workload are prefilled, switched every round between: all on (the default), the SiLU·mul
   kernel off (projections still fused), projections unfused (hence no SiLU·mul either), the
   argmax/log-sum-exp kernel off, none of them.

Every comparison alternates its variants round by round (the box is shared and drifts); op timings
keep each variant's best round, whole steps the median round.

    python -m benchmarks.step_kernels [--dtype fp32,bf16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import RESULTS, per_dtype_main, rnd

SIZES = {"q": 576, "k": 192, "v": 192, "gate": 1536, "up": 1536}


def _alternate(variants: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, float]:
    """Best per-call milliseconds of each variant, the variants alternated round by round."""
    best = {name: float("inf") for name in variants}
    for fn in variants.values():
        fn()
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e3)
    return best


def projections(dtype: Any, rows: int, rounds: int) -> dict[str, Any]:
    import torch

    from djl_handlers.engines.hf.cpu.linear import reorder, run_packed

    gen = torch.Generator().manual_seed(0)
    weights = {k: (torch.randn(n, 576, generator=gen) * 0.05).to(dtype) for k, n in SIZES.items()}
    x = torch.randn(rows, 576, generator=gen).to(dtype)
    single = {k: reorder(w) for k, w in weights.items()}
    qkv = reorder(torch.cat([weights["q"], weights["k"], weights["v"]]))
    gate_up = reorder(torch.cat([weights["gate"], weights["up"]]))

    def separate() -> None:
        for packed in single.values():
            run_packed(x, packed, None)

    def fused() -> None:
        run_packed(x, qkv, None).split([576, 192, 192], dim=-1)
        run_packed(x, gate_up, None).split([1536, 1536], dim=-1)

    best = _alternate({"separate": separate, "fused": fused}, rounds, 100)
    return {"rows": rows, "separate_us": rnd(best["separate"] * 1e3, 1), "fused_us": rnd(best["fused"] * 1e3, 1),
            "speedup": rnd(best["separate"] / best["fused"]),
            "saved_per_step_ms_30_layers": rnd(30 * (best["separate"] - best["fused"]))}


def silu_mul_pass(dtype: Any, rows: int, rounds: int) -> dict[str, Any]:
    import torch

    from djl_handlers.kernels.silu_mul import reference, silu_mul

    gate_up = (torch.randn(rows, 1, 3072, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    best = _alternate({"torch": lambda: reference(gate_up), "kernel": lambda: silu_mul(gate_up)}, rounds, 200)
    return {"rows": rows, "torch_us": rnd(best["torch"] * 1e3, 1), "kernel_us": rnd(best["kernel"] * 1e3, 1),
            "speedup": rnd(best["torch"] / best["kernel"])}


def rotary_pass(dtype: Any, batch: int, seq: int, rounds: int) -> dict[str, Any]:
    import torch
    from transformers.models.llama import modeling_llama

    from djl_handlers.engines.hf.cpu.rotary import FastRotary
    from djl_handlers.kernels.rotary import rotary

    original = modeling_llama.apply_rotary_pos_emb
    original = original.original if isinstance(original, FastRotary) else original
    gen = torch.Generator().manual_seed(3)
    fused = torch.randn(batch, seq, 960, generator=gen).to(dtype)  # q/k/v slices, as the fused GEMM gives them
    q = fused[..., :576].view(batch, seq, 9, 64).transpose(1, 2)
    k = fused[..., 576:768].view(batch, seq, 3, 64).transpose(1, 2)
    angles = torch.rand(batch, seq, 64, generator=gen) * 20
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    best = _alternate({"torch": lambda: original(q, k, cos, sin), "kernel": lambda: rotary(q, k, cos, sin)},
                      rounds, 50)
    return {"batch": batch, "seq": seq, "torch_us": rnd(best["torch"] * 1e3, 1),
            "kernel_us": rnd(best["kernel"] * 1e3, 1), "speedup": rnd(best["torch"] / best["kernel"])}


def logits_pass(dtype: Any, rows: int, rounds: int) -> dict[str, Any]:
    import torch

    from djl_handlers.kernels.row_stats import row_stats

    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(rows, 49152, generator=gen) * 3).to(dtype)

    def torch_ops() -> None:
        x = logits.float()
        tokens = x.argmax(dim=-1)
        (x.gather(1, tokens.unsqueeze(1)).squeeze(1) - torch.logsumexp(x, dim=-1)).tolist()

    def kernel() -> None:
        stats = row_stats(logits)
        assert stats is not None
        (logits.gather(1, stats[0].unsqueeze(1)).squeeze(1).float() - stats[1]).tolist()

    best = _alternate({"torch": torch_ops, "kernel": kernel}, rounds, 50)
    return {"rows": rows, "torch_ms": rnd(best["torch"], 3), "kernel_ms": rnd(best["kernel"], 3),
            "speedup": rnd(best["torch"] / best["kernel"])}


def engine_steps(dtype: Any, rounds: int) -> dict[str, Any]:
    from benchmarks.workload import decoding_engine
    from djl_handlers.engines.hf import sampling
    from djl_handlers.engines.hf.cpu import ragged_attention
    from djl_handlers.engines.hf.cpu.fused import fuse_projections, unfuse_projections
    from djl_handlers.engines.hf.cpu.linear import prepack_linears
    from djl_handlers.engines.hf.cpu.norm import fuse_rms_norms
    from djl_handlers.kernels.row_stats import row_stats

    def prepare(model: Any) -> None:
        prepack_linears(model)
        fuse_rms_norms(model)
        ragged_attention.enable(model)

    model, engine = decoding_engine(dtype, prepare)
    batch = engine._batch
    assert batch is not None
    shape = {"rows": len(batch.rows), "width": batch.width}

    def switch(fused: bool, kernel: bool, mlp: bool = True) -> Callable[[], None]:
        def apply() -> None:
            unfuse_projections(model)
            if fused:
                fuse_projections(model, check=False, mlp=mlp)
            sampling.row_stats = row_stats if kernel else (lambda logits: None)  # type: ignore[assignment]
        return apply

    modes = {"all": switch(True, True), "no_silu_mul": switch(True, True, mlp=False),
             "no_fused_projections": switch(False, True), "no_row_stats": switch(True, False),
             "none": switch(False, False)}
    times: dict[str, list[float]] = {name: [] for name in modes}
    try:
        for _ in range(rounds):
            for name, apply in modes.items():
                apply()
                engine.step()  # one untimed step after the switch
                t0 = time.perf_counter()
                for _ in range(4):
                    engine.step()
                times[name].append((time.perf_counter() - t0) / 4 * 1e3)
    finally:
        switch(True, True)()
    best = {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}  # the median round
    return {**shape, "steps_per_round": 4, "rounds_ms": {k: [rnd(t, 1) for t in ts] for k, ts in times.items()},
            **{f"{k}_ms": rnd(v, 1) for k, v in best.items()},
            "all_vs_none": rnd(best["none"] / best["all"]),
            "silu_mul_alone": rnd(best["no_silu_mul"] / best["all"]),
            "fused_projections_with_silu_mul": rnd(best["no_fused_projections"] / best["all"]),
            "row_stats_alone": rnd(best["no_row_stats"] / best["all"])}


def _measure(dtype: Any, args: argparse.Namespace) -> dict[str, Any]:
    return {"projections": [projections(dtype, rows, args.rounds) for rows in (16, 32)],
            "silu_mul": [silu_mul_pass(dtype, rows, args.rounds) for rows in (16, 32, 512)],
            "rotary": [rotary_pass(dtype, b, t, args.rounds) for b, t in ((32, 1), (1, 512), (4, 128))],
            "logits_pass": [logits_pass(dtype, rows, args.rounds) for rows in (16, 32)],
            "engine_decode_step": engine_steps(dtype, args.rounds)}


def main(argv: list[str] | None = None) -> None:
    per_dtype_main(__doc__ or "", argv, RESULTS / "step-kernels.json", 9, _measure)


if __name__ == "__main__":
    main()
