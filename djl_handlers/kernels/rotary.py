"""Rotary position embedding of queries and keys on the CPU (the C kernel in ``rotary.c``).

:func:`rotary` computes what transformers' Llama-family ``apply_rotary_pos_emb`` computes with
about seven torch operations per tensor (two slices, a negation, a concatenation, two products, a
sum), in one pass over query and key, with the same bits in fp32 and bf16: each product and the sum
rounded once to the storage type, as torch rounds them; the library is built without fast-math or
FMA contraction. Positions are independent, so a row gets the same bits alone as in any batch.

Returns None — callers then use torch — when the kernel is unavailable or the call is outside what
it handles: query/key ``[B, H, S, D]`` with unit stride over an even ``D``, ``cos``/``sin``
``[B or 1, S, D]`` of the same dtype (fp32 or bf16), all on the CPU, no autograd.
"""

from __future__ import annotations

import ctypes

import torch

from djl_handlers.kernels import build

NAME = "rotary"
FLAGS = ("-fno-fast-math", "-fno-math-errno", "-ffp-contract=off")

_KERNEL = build.Function(NAME, "djl_rotary", [
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
    ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int], flags=FLAGS)
library = _KERNEL.get
available = _KERNEL.available
unavailable_reason = _KERNEL.unavailable_reason


def _view(x: torch.Tensor) -> ctypes.Array[ctypes.c_int64]:
    b, h, s, d = x.shape
    sb, sh, ss, _ = x.stride()
    return (ctypes.c_int64 * 7)(b, h, s, d, sb, sh, ss)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)`` with ``cos``/``sin``
    broadcast over the head dimension (``unsqueeze_dim=1``), as new contiguous tensors; None when
    the call is outside what the kernel handles (see the module doc)."""
    fn = _KERNEL.fn or _KERNEL.get()
    dtype = q.dtype
    if fn is None or (dtype is not torch.float32 and dtype is not torch.bfloat16):
        return None
    if k.dtype is not dtype or cos.dtype is not dtype or sin.dtype is not dtype:
        return None
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return None
    if not (q.is_cpu and k.is_cpu and cos.is_cpu and sin.is_cpu):
        return None
    b, _, s, d = q.shape
    if d % 2 or k.shape[0] != b or k.shape[2] != s or k.shape[3] != d or tuple(cos.shape[1:]) != (s, d):
        return None
    if cos.shape[0] not in (1, b) or q.stride(3) != 1 or k.stride(3) != 1:
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or cos.requires_grad or sin.requires_grad):
        return None
    cos, sin = cos.contiguous(), sin.contiguous()
    q_out = torch.empty(q.shape, dtype=dtype)
    k_out = torch.empty(k.shape, dtype=dtype)
    if q.numel() or k.numel():
        fn(q.data_ptr(), _view(q), k.data_ptr(), _view(k), cos.data_ptr(), sin.data_ptr(), cos.shape[0],
           q_out.data_ptr(), k_out.data_ptr(), int(dtype is torch.bfloat16), max(1, torch.get_num_threads()))
    return q_out, k_out
