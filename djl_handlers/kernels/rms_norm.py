"""Fused Llama RMSNorm on the CPU (the C kernel in ``rms_norm.c``).

:func:`rms_norm` computes, in one pass per row, what ``LlamaRMSNorm.forward`` computes in about
eight torch operations (to fp32, pow, mean, add eps, rsqrt, mul, to the input dtype, mul by the
weight), with the same bits: the sum of squares follows ATen's CPU summation order for the running
CPU capability (see the C file), every other step is one correctly rounded IEEE operation, and
the kernel is compiled without fast-math or FMA contraction. Rows are independent, so a row gets
the same bits alone as in any batch.

fp32 and bf16 (the weight of the same dtype as the input), CPU tensors; anything else (fp16, a
dtype mismatch, CUDA, an unknown CPU capability of torch, an input that needs autograd) is refused
with ``None`` so callers fall back to torch. A non-contiguous input is copied first.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from djl_handlers.kernels import build

NAME = "rms_norm"
DTYPES = (torch.float32, torch.bfloat16)
# IEEE arithmetic: no reassociation of the sums, no x*x+acc fused into an FMA (they change bits).
FLAGS = ("-fno-fast-math", "-fno-math-errno", "-ffp-contract=off")
# Vector widths ATen's float sum kernel may run with (8 on x86-64, even under AVX512); the one in
# use here is found once by comparing with torch (see lanes()).
_CANDIDATE_LANES = (8, 16, 4)
_PROBE_WIDTHS = (5, 37, 100, 576, 1000)

_fn: Any = None
_lanes: int | None = None
_lanes_known = False


def library() -> Any:
    """The loaded kernel function (building the library if needed), or None when unavailable."""
    global _fn
    if _fn is None:
        lib = build.load(NAME, FLAGS)
        if lib is None:
            return None
        fn = lib.djl_rms_norm
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        _fn = fn
    return _fn


def available() -> bool:
    """True when the kernel builds and loads here (see :func:`unavailable_reason` otherwise)."""
    return library() is not None


def unavailable_reason() -> str | None:
    """Why the kernel cannot be used (None when it can)."""
    return None if available() else build.error(NAME) or "not built"


def lanes() -> int | None:
    """The vector width ATen sums floats with here, found once by running the kernel with each
    candidate width on random rows and keeping the first whose results equal torch's bit for bit
    (None: none does, or the kernel is unavailable; :func:`rms_norm` then refuses everything)."""
    global _lanes, _lanes_known
    if not _lanes_known:
        _lanes = _calibrate()
        _lanes_known = True
    return _lanes


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``LlamaRMSNorm.forward``'s formula in torch operations (what the kernel reproduces)."""
    dtype = x.dtype
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(variance + eps)).to(dtype)


def _calibrate() -> int | None:
    fn = library()
    if fn is None:
        return None
    gen = torch.Generator().manual_seed(1234)
    probes = []
    for width in _PROBE_WIDTHS:
        x = torch.randn(3, width, generator=gen) * torch.rand(3, 1, generator=gen) * 8
        weight = torch.randn(width, generator=gen)
        probes.append((x, weight, reference(x, weight, 1e-6)))
    with torch.no_grad():
        for width in _CANDIDATE_LANES:
            results = [(_run(fn, x, weight, 1e-6, width), want) for x, weight, want in probes]
            if all(got is not None and torch.equal(got, want) for got, want in results):
                return width
    return None


def _run(fn: Any, x: torch.Tensor, weight: torch.Tensor, eps: float, width: int) -> torch.Tensor | None:
    """The kernel on contiguous ``x`` [..., H] and ``weight`` [H] of one dtype (None if it refuses)."""
    hidden = x.shape[-1]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rows = x.numel() // hidden
    if rows == 0:
        return out
    rc = fn(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, hidden, float(eps),
            int(x.dtype == torch.bfloat16), width, max(1, torch.get_num_threads()))
    return out if rc == 0 else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """``weight * (x * rsqrt(mean(x², -1) + eps))`` as Llama computes it, for ``x`` [..., H] and
    ``weight`` [H]; returns a new contiguous tensor shaped like ``x``, or None when the inputs are
    outside what the kernel handles (or it is unavailable)."""
    fn = _fn if _fn is not None else library()
    width = _lanes if _lanes_known else lanes()
    if fn is None or width is None or not _supported(x, weight):
        return None
    return _run(fn, x.contiguous(), weight.contiguous(), eps, width)


def _supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    # on every call of every norm: cheap attribute checks only (this runs ~60 times per forward)
    dtype = x.dtype
    if (dtype is not torch.float32 and dtype is not torch.bfloat16) or weight.dtype is not dtype:
        return False
    if not (x.is_cpu and weight.is_cpu) or x.layout is not torch.strided or weight.layout is not torch.strided:
        return False
    if weight.dim() != 1 or x.dim() < 1 or x.shape[-1] != weight.shape[0] or weight.shape[0] == 0:
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
