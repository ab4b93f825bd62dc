"""``silu(gate) * up`` over a fused gate/up projection output on the CPU (``silu_mul.c``).

:func:`silu_mul` takes the ``[..., 2 * inter]`` output of the fused ``gate_proj``/``up_proj`` GEMM
(:mod:`djl_handlers.engines.hf.cpu.fused`) and returns the ``[..., inter]`` input of ``down_proj``
in one pass, where a Llama MLP runs ``act_fn(gate)`` and ``* up`` as two operations with a
temporary. Rounding follows torch's steps (bf16: silu rounded to bf16, then the product rounded);
values differ from torch's only where glibc's ``expf`` and torch's differ in the last bit. Rows are
independent (a row's result never depends on the others in the call).

Returns None — callers then use torch — when the kernel is unavailable or the input is not a CPU
fp32/bf16 tensor with an even last dimension and unit column stride.
"""

from __future__ import annotations

import ctypes

import torch

from djl_handlers.kernels import build

NAME = "silu_mul"

_KERNEL = build.Function(NAME, "djl_silu_mul", [
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int])
library = _KERNEL.get
available = _KERNEL.available
unavailable_reason = _KERNEL.unavailable_reason


def reference(gate_up: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in torch operations (a Llama MLP's ``act_fn(gate) * up``)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """``silu(gate_up[..., :n]) * gate_up[..., n:]`` for ``n = gate_up.shape[-1] // 2``, as a new
    contiguous tensor; None when the kernel does not handle this input (see the module doc)."""
    fn = _KERNEL.fn or _KERNEL.get()
    dtype = gate_up.dtype
    if fn is None or (dtype is not torch.float32 and dtype is not torch.bfloat16) or not gate_up.is_cpu:
        return None
    width = gate_up.shape[-1] if gate_up.dim() else 0
    if width == 0 or width % 2 or gate_up.layout is not torch.strided:
        return None
    if torch.is_grad_enabled() and gate_up.requires_grad:
        return None
    flat = gate_up.reshape(-1, width)  # a view for the engine's [rows, 1, 2n] and [1, tokens, 2n] outputs
    if flat.stride(1) != 1:
        flat = flat.contiguous()
    inter = width // 2
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=dtype)
    rows = flat.shape[0]
    if rows:
        fn(flat.data_ptr(), out.data_ptr(), int(dtype is torch.bfloat16), rows, inter, flat.stride(0),
           max(1, torch.get_num_threads()))
    return out
