"""Attention over each row's real tokens (the C kernel in ``decode_attention.c``).

:func:`attention` computes, for the last ``Q`` columns of a left-padded cache (``Q`` = 1 for a
decode step, the prompt's tokens for a prefill), causal ``softmax(q·Kᵀ·scale)·V`` over each row's
columns ``[start[b], own column]`` only: the left padding is never read, grouped-query heads read
their shared key/value head once, and a query's result does not depend on the other rows or
queries of the call (the same bits alone or in any batch). :func:`decode_attention` is the
one-query form. Arithmetic is fp32; the (query, key/value) dtypes are one of :data:`COMBOS`: fp32
with an fp32, bf16 or fp16 key/value cache (a 16-bit cache under fp32 weights, as llama.cpp's F16
KV cache: half the bytes read per step), or bf16 with a bf16 cache; keys and values have the same
dtype and the output has the query's. CPU tensors whose last dimension is contiguous; anything else
is refused with ``None`` so callers can fall back to torch.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from djl_handlers.kernels import build

NAME = "decode_attention"
# The kernel's element kinds (its q_kind / kv_kind arguments).
KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# Supported (query and output dtype, key and value dtype) pairs.
COMBOS = frozenset({(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                    (torch.float32, torch.bfloat16), (torch.float32, torch.float16)})
# The query (and output) dtypes.
DTYPES = (torch.float32, torch.bfloat16)


class _Shape(ctypes.Structure):
    _fields_ = [  # noqa: RUF012 (ctypes reads it as a class attribute)
        *((name, ctypes.c_int64) for name in ("rows", "heads", "kv_heads", "dim", "width", "q_row", "q_head",
                                              "k_row", "k_head", "k_col", "v_row", "v_head", "v_col", "queries",
                                              "q_tok")),
        ("scale", ctypes.c_float),
        ("threads", ctypes.c_int),
    ]


_fn: Any = None


def library() -> Any:
    """The loaded kernel function (building the library if needed), or None when unavailable."""
    global _fn
    if _fn is None:
        lib = build.load(NAME)
        if lib is None:
            return None
        fn = lib.djl_decode_attention
        fn.argtypes = [ctypes.POINTER(_Shape), ctypes.c_int, ctypes.c_int, *([ctypes.c_void_p] * 5)]
        fn.restype = ctypes.c_int
        _fn = fn
    return _fn


def available() -> bool:
    """True when the kernel builds and loads here (see :func:`unavailable_reason` otherwise)."""
    return library() is not None


def unavailable_reason() -> str | None:
    """Why the kernel cannot be used (None when it can)."""
    return None if available() else build.error(NAME) or "not built"


def path() -> str | None:
    """The code path this build of the kernel takes (``avx512``, ``avx2`` or ``plain C``: chosen by
    the build's target, ``-march=native`` or ``DJL_HANDLERS_KERNEL_MARCH``), or None when the kernel
    is unavailable."""
    lib = build.load(NAME)
    if lib is None:
        return None
    fn = lib.djl_decode_attention_path
    fn.argtypes, fn.restype = [], ctypes.c_char_p
    return fn().decode()


def decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, starts: torch.Tensor, scale: float
) -> torch.Tensor | None:
    """``query`` [B, H, D], ``key``/``value`` [B, H_kv, T, D] (any strides, last one 1), ``starts``
    [B] int64: row ``b`` attends to columns ``[starts[b], T)``. dtypes as :func:`attention`'s (a
    :data:`COMBOS` pair). Returns [B, H, D] contiguous in the query's dtype, or None when the inputs
    are outside what the kernel handles (or it is unavailable)."""
    if query.dim() != 3:
        return None
    out = attention(query.unsqueeze(2), key, value, starts, scale)
    return None if out is None else out.view(query.shape[0], query.shape[1], value.shape[-1])


def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, starts: torch.Tensor, scale: float
) -> torch.Tensor | None:
    """Causal attention of the last ``Q`` columns over a left-padded cache. ``query`` [B, H, Q, D],
    ``key``/``value`` [B, H_kv, T, D] (any strides, last one 1; the queries are columns
    ``T - Q .. T - 1``), ``starts`` [B] int64: row ``b``'s tokens are columns ``[starts[b], T)``.
    Query ``i`` attends to columns ``[starts[b], T - Q + i]``; a query left of ``starts[b]`` (padding)
    gets zeros. dtypes: ``(query.dtype, key.dtype)`` one of :data:`COMBOS` (fp32 query with fp32,
    bf16 or fp16 keys and values; bf16 with bf16), ``value.dtype == key.dtype``. Returns [B, Q, H, D]
    contiguous (transformers' attention output layout) in the query's dtype, or None when the inputs
    are outside what the kernel handles (or it is unavailable)."""
    fn = library()
    if fn is None or not _supported(query, key, value, starts):
        return None
    rows, heads, queries, dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    out = query.new_empty((rows, queries, heads, value.shape[-1]))
    if rows == 0:
        return out
    shape = _Shape(
        rows, heads, kv_heads, dim, width,
        query.stride(0), query.stride(1),
        key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2),
        queries, query.stride(2),
        float(scale), max(1, torch.get_num_threads()),
    )
    starts = starts.contiguous()
    rc = fn(ctypes.byref(shape), KINDS[query.dtype], KINDS[key.dtype], query.data_ptr(), key.data_ptr(),
            value.data_ptr(), starts.data_ptr(), out.data_ptr())
    return out if rc == 0 else None


def _supported(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, starts: torch.Tensor) -> bool:
    tensors = (query, key, value)
    if any(t.device.type != "cpu" for t in tensors) or value.dtype != key.dtype:
        return False
    if (query.dtype, key.dtype) not in COMBOS:
        return False
    if query.dim() != 4 or key.dim() != 4 or value.shape != key.shape or any(t.stride(-1) != 1 for t in tensors):
        return False
    rows, heads, queries, dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    if key.shape[0] != rows or key.shape[3] != dim or kv_heads == 0 or heads % kv_heads or not 0 < queries <= width:
        return False
    return starts.dtype == torch.int64 and starts.device.type == "cpu" and tuple(starts.shape) == (rows,)
