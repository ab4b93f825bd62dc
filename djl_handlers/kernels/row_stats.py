"""Per-row argmax and log-sum-exp of next-token logits on the CPU (the C kernel in ``row_stats.c``).

Every decode step needs, per row, the greedy token and ``log_z = logsumexp(logits)`` (the reported
``log_prob`` is ``logit[token] - log_z``). In torch that is a copy to fp32, ``argmax`` and
``logsumexp`` (``amax``, ``sub``, ``exp``, ``sum``, ``log``): six full passes over a
``[rows, vocab]`` matrix (49,152 columns for SmolLM2) and as many dispatches. The kernel reads the
logits in their own dtype (fp32 or bf16) in two passes. ``log_z`` agrees with torch's to rounding
(a different summation order and glibc's vectorised ``expf``); ``argmax`` is exact, with torch's
tie rule (the first maximum).

:func:`row_stats` returns None — callers then use torch — when the kernel is unavailable, the input
is not a 2-D CPU fp32/bf16 tensor, or any row holds NaN or +inf or only -inf (torch defines what
those give; -inf entries, i.e. masked tokens, are fine).
"""

from __future__ import annotations

import ctypes

import torch

from djl_handlers.kernels import build

NAME = "row_stats"

_KERNEL = build.Function(NAME, "djl_row_stats", [
    ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
    ctypes.c_void_p, ctypes.c_int])
library = _KERNEL.get
available = _KERNEL.available
unavailable_reason = _KERNEL.unavailable_reason


def row_stats(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(argmax, log_z)`` of each row of ``logits`` [rows, vocab]: int64 and float32 tensors of
    ``rows`` values; None when the kernel does not handle this input (see the module doc)."""
    fn = _KERNEL.fn or _KERNEL.get()
    if fn is None or logits.dim() != 2 or not logits.is_cpu or logits.layout is not torch.strided:
        return None
    dtype = logits.dtype
    if dtype is not torch.float32 and dtype is not torch.bfloat16:
        return None
    rows, vocab = logits.shape
    if vocab == 0:
        return None
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    argmax = torch.empty(rows, dtype=torch.int64)
    log_z = torch.empty(rows, dtype=torch.float32)
    if rows == 0:
        return argmax, log_z
    bad = fn(logits.data_ptr(), int(dtype is torch.bfloat16), rows, vocab, logits.stride(0),
             argmax.data_ptr(), log_z.data_ptr(), max(1, torch.get_num_threads()))
    return None if bad else (argmax, log_z)
