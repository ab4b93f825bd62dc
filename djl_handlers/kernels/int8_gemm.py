"""Int8 GEMM with per-row dynamic int8 activations on the CPU (the C kernel in ``int8_gemm.c``).

``option.quantize=dynamic_int8`` keeps each linear layer's weight as int8 with one fp32 scale per
output channel (:mod:`djl_handlers.engines.hf.cpu.int8`). :func:`pack` stores such a weight once in
the kernel's blocked layout; :func:`gemm` then quantizes each row of the input by its own peak
(``round(x * 127 / max|x|)``), sums the int8 products exactly in int32 and scales back to fp32, in
one call: one ctypes call replaces the dozen torch operations a call of fbgemm's
``quantized::linear_dynamic`` needs around it to keep rows independent, and a one-row call reads
the weight once. The instruction path is chosen when the kernel is compiled (:func:`path`:
AVX-512 VNNI, AVX-VNNI, AVX2 or portable C); every path gives the same bits, since the sums are
exact and the scaling is two fp32 multiplies in a fixed order, and a row's bits never depend on
the other rows of the call. No path saturates (AVX2's 16-bit pair sums stay under 32,258), so
weights use the full [-127, 127].

:func:`gemm` returns None — the caller then uses fbgemm — when the kernel is unavailable.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from djl_handlers.kernels import build

NAME = "int8_gemm"
# IEEE arithmetic without contraction: the scaling's bits must not depend on the path or the tiling
FLAGS = ("-fno-fast-math", "-ffp-contract=off")
_PATH = build.Function(NAME, "djl_int8_path", [], FLAGS)
_BYTES = build.Function(NAME, "djl_int8_packed_bytes", [ctypes.c_int64, ctypes.c_int64], FLAGS, ctypes.c_int64)
_PACK = build.Function(NAME, "djl_int8_pack", [
    ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p], FLAGS)
_GEMM = build.Function(NAME, "djl_int8_gemm", [
    ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int], FLAGS)
library = _GEMM.get
available = _GEMM.available
unavailable_reason = _GEMM.unavailable_reason
PATHS = {3: "AVX-512 VNNI", 2: "AVX-VNNI", 1: "AVX2", 0: "portable C"}


def path() -> str | None:
    """The instruction path this build of the kernel runs (None when it is unavailable)."""
    fn = _PATH.get()
    return None if fn is None else PATHS.get(int(fn()), "unknown")


@dataclass(frozen=True)
class PackedInt8:
    """An ``[out_features, in_features]`` int8 weight in the kernel's layout, with its per-channel
    scales (fp32) and each channel's sum of weights (int32)."""

    data: torch.Tensor
    colsum: torch.Tensor
    scales: torch.Tensor
    out_features: int
    in_features: int


def pack(q: torch.Tensor, scales: torch.Tensor) -> PackedInt8 | None:
    """``q`` (int8 ``[out, in]``) and ``scales`` (``[out]``) in the kernel's layout; None when the
    kernel is unavailable."""
    fn, size = _PACK.get(), _BYTES.get()
    if fn is None or size is None:
        return None
    q = q.detach().to(torch.int8).contiguous()
    out, inp = q.shape
    data = torch.empty(int(size(out, inp)), dtype=torch.int8)
    colsum = torch.empty((out + 15) // 16 * 16, dtype=torch.int32)
    fn(q.data_ptr(), out, inp, data.data_ptr(), colsum.data_ptr())
    return PackedInt8(data, colsum, scales.detach().float().contiguous(), int(out), int(inp))


def gemm(x: torch.Tensor, weight: PackedInt8, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """``x`` ([rows, in] fp32, unit column stride) times the packed weight, plus ``bias`` (fp32
    ``[out]``), as a new ``[rows, out]`` fp32 tensor; None when the kernel is unavailable."""
    fn = _GEMM.fn or _GEMM.get()
    if fn is None:
        return None
    rows = x.shape[0]
    out = torch.empty(rows, weight.out_features)
    if rows:
        failed = fn(x.data_ptr(), rows, x.stride(0), weight.in_features, weight.data.data_ptr(),
                    weight.colsum.data_ptr(), weight.scales.data_ptr(), None if bias is None else bias.data_ptr(),
                    out.data_ptr(), weight.out_features, max(1, torch.get_num_threads()))
        if failed:
            raise MemoryError(f"int8 GEMM: cannot allocate {rows} rows of {weight.in_features} bytes")
    return out


def reference(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What :func:`gemm` computes, in torch operations (float64 sums, exact for these sizes)."""
    peak = x.abs().amax(dim=1, keepdim=True)
    inv = torch.where(peak > 0, 127.0 / peak, torch.zeros_like(peak))
    qx = torch.round(x * inv).clamp(-127, 127)
    sums = (qx.double() @ q.double().t()).float()
    out = sums * scales.float() * (peak / 127.0)
    return out if bias is None else out + bias
