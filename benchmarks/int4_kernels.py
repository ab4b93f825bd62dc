"""Would weight-only int4 pay on this CPU? torch's int4 kernel against our int8 and fp32 linear layers.

Before an ``option.quantize`` value for 4-bit weights is worth building, its kernel has to be faster than
the int8 layer the HF engine already has (``dynamic_int8``, :mod:`djl_handlers.engines.hf.cpu.int8`) where
4 bits should help most: decoding one request, where every step reads every weight once and the step is
bound by memory. This measures the kernels alone on the embedded model's own projection weights, one
pass over every decoder layer's linear layers (the lm head aside, as the int8 layer leaves it), at
1 and 32 rows:

- ``fp32``: the engine's default CPU linear (oneDNN, prepacked weights: ``cpu.linear.PackedLinear``);
- ``int8``: ``cpu.int8.Int8Linear`` (fbgemm, per-channel scales, this CPU's weight range);
- ``int4-g<G>``: ``aten._weight_int4pack_mm_for_cpu`` (torch's CPU kernel for 4-bit weights packed by
  ``aten._convert_weight_to_int4pack_for_cpu``, asymmetric, one scale and zero per group of ``G`` input
  channels; the kernel torchao's int4 weight-only layout runs on the CPU), fp32 activations;
- ``int4-dyn-g32``: ``aten._dyn_quant_matmul_4bit`` over ``aten._dyn_quant_pack_4bit_weight`` (symmetric
  4-bit weights per block of 32, activations quantized per row on the fly: KleidiAI's scheme on arm64;
  elsewhere torch's portable fallback).

Rounds rotate the variants' order; each figure is the median over rounds of the best-of-``repeats`` pass
time (passes stop after ``--budget`` seconds). Accuracy: the relative Frobenius error of each
variant's outputs against fp32's on the same activations (rows of unit-normal values), on the first
decoder layer's projections with Gaussian weights of the same spread: the embedded model's own weights
come from a Q4_1 GGUF file (4-bit codes with a scale and a minimum per block of 32), which ``int4-g32``
reproduces exactly, so they would flatter 4 bits.

    .venv/bin/python -m benchmarks.int4_kernels            # 5 rounds
    .venv/bin/python -m benchmarks.int4_kernels --quick    # 1 round
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import context, print_table, rnd, setup_torch, write_report

GROUPS = (32, 64)  # 576, the embedded model's width, is 9 x 64
ROWS = (1, 32)


def int4_layer(weight: Any, group: int) -> Callable[[Any], Any]:
    """``x @ weight.T`` through torch's CPU int4 kernel: asymmetric 4-bit codes per group of ``group``
    input channels, ``w ~ (q - 8) * scale + zero`` (the kernel's convention)."""
    import torch

    out_features, in_features = weight.shape
    w = weight.detach().float().reshape(out_features, in_features // group, group)
    low, high = w.amin(dim=2), w.amax(dim=2)
    scale = ((high - low) / 15).clamp_min(1e-8)
    codes = torch.round((w - low.unsqueeze(2)) / scale.unsqueeze(2)).clamp(0, 15)
    zero = low + 8 * scale  # (q - 8) * scale + zero == low + q * scale
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        codes.reshape(out_features, in_features).to(torch.int32).contiguous(), 2)
    scales_zeros = torch.stack([scale.T, zero.T], dim=-1).contiguous()  # [groups, out, 2]

    def run(x: Any) -> Any:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_zeros)

    return run


def int4_dynamic_layer(weight: Any, block: int = 32) -> Callable[[Any], Any]:
    """``x @ weight.T`` through torch's dynamically quantized 4-bit matmul: symmetric codes per block of
    ``block`` input channels, ``w ~ (q - 8) * scale``, two codes per byte, the even channel low."""
    import torch

    out_features, in_features = weight.shape
    w = weight.detach().float().reshape(out_features, in_features // block, block)
    scale = (w.abs().amax(dim=2) / 7).clamp_min(1e-8)
    codes = (torch.round(w / scale.unsqueeze(2)).clamp(-8, 7) + 8).to(torch.uint8).reshape(out_features, in_features)
    pairs = (codes[:, 1::2] << 4 | codes[:, ::2]).contiguous()
    packed = torch.ops.aten._dyn_quant_pack_4bit_weight(pairs, scale.contiguous(), None, block,
                                                        in_features, out_features)

    def run(x: Any) -> Any:
        return torch.ops.aten._dyn_quant_matmul_4bit(x, packed, block, in_features, out_features)

    return run


def projections() -> dict[str, Any]:
    """Every decoder layer's ``nn.Linear`` of the embedded model, in fp32, by module name."""
    import torch
    from transformers import AutoModelForCausalLM

    from djl_handlers.model.embedded import embedded_model_dir

    model = AutoModelForCausalLM.from_pretrained(str(embedded_model_dir()), dtype=torch.float32)
    return {name: m for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and ".layers." in name}


def variants(linears: list[Any]) -> dict[str, list[Callable[[Any], Any]]]:
    from djl_handlers.engines.hf.cpu import int8, linear

    built: dict[str, list[Callable[[Any], Any]]] = {
        "fp32": [linear.PackedLinear(m) for m in linears] if linear.available() else list(linears),
        "int8": [int8.Int8Linear(m) for m in linears],
    }
    for group in GROUPS:
        built[f"int4-g{group}"] = [int4_layer(m.weight, group) for m in linears]
    built["int4-dyn-g32"] = [int4_dynamic_layer(m.weight) for m in linears]
    return built


def gaussian_copies(linears: list[Any]) -> list[Any]:
    """``nn.Linear`` layers shaped as ``linears`` with normal weights of the same standard deviation."""
    import torch

    copies = []
    for m in linears:
        copy = torch.nn.Linear(m.in_features, m.out_features, bias=False)
        with torch.no_grad():
            copy.weight.normal_(0.0, float(m.weight.std()))
        copies.append(copy)
    return copies


def relative_errors(linears: list[Any], rows: int) -> dict[str, float]:
    """Each variant's relative error against fp32 over ``linears`` (one input of ``rows`` rows each)."""
    import torch

    built = variants(linears)
    inputs = [torch.randn(rows, m.in_features) for m in linears]
    with torch.inference_mode():
        want = [layer(x) for layer, x in zip(built["fp32"], inputs, strict=True)]
        den = sum(float(w.pow(2).sum()) for w in want)
        error = {}
        for name, layers in built.items():
            got = [layer(x) for layer, x in zip(layers, inputs, strict=True)]
            error[name] = (sum(float((g - w).pow(2).sum()) for g, w in zip(got, want, strict=True)) / den) ** 0.5
    return error


def best_pass(layers: list[Callable[[Any], Any]], inputs: list[Any], repeats: int, budget: float) -> float:
    """The fastest of up to ``repeats`` passes, stopping once ``budget`` seconds are spent."""
    best = float("inf")
    start = time.perf_counter()
    for _ in range(repeats):
        best = min(best, one_pass(layers, inputs))
        if time.perf_counter() - start > budget:
            break
    return best


def one_pass(layers: list[Callable[[Any], Any]], inputs: list[Any]) -> float:
    import torch

    start = time.perf_counter()
    with torch.inference_mode():
        for layer, x in zip(layers, inputs, strict=True):
            layer(x)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20, help="passes per round; the best counts")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of passes per variant and round")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rounds, repeats = (1, 5) if args.quick else (args.rounds, args.repeats)
    setup_torch()
    import torch

    from djl_handlers.engines.hf.cpu import int8

    started = context()
    named = projections()
    linears = list(named.values())
    built = variants(linears)
    names = list(built)
    torch.manual_seed(0)
    rows_out: list[dict[str, Any]] = []
    first_layer = gaussian_copies([m for name, m in named.items() if ".layers.0." in name])
    for rows in ROWS:
        inputs = [torch.randn(rows, m.in_features) for m in linears]
        error = relative_errors(first_layer, rows)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                one_pass(built[name], inputs)  # warm
                times[name].append(best_pass(built[name], inputs, repeats, args.budget))
        int8_ms = statistics.median(times["int8"]) * 1e3
        fp32_ms = statistics.median(times["fp32"]) * 1e3
        for name in names:
            ms = statistics.median(times[name]) * 1e3
            rows_out.append({"rows": rows, "variant": name, "ms_per_pass": rnd(ms, 3),
                             "ms_rounds": [rnd(t * 1e3, 3) for t in times[name]],
                             "vs_fp32": rnd(fp32_ms / ms), "vs_int8": rnd(int8_ms / ms),
                             "rel_error": rnd(error[name], 4)})
    print_table(rows_out, ["rows", "variant", "ms_per_pass", "vs_fp32", "vs_int8", "rel_error"],
                f"{len(linears)} projections of the embedded model (speed-up: > 1 is faster)")
    write_report("int4-kernels", {"layers": len(linears), "rounds": rounds, "repeats": repeats,
                                  "int8_weight_limit": int8.weight_limit(), "rows": rows_out},
                 args.quick, started)


if __name__ == "__main__":
    main()
