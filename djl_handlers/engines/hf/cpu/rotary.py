"""Rotary position embedding in one C call for HF models on the CPU (``option.cpu_rotary``).

Llama-family attention (Llama, Mistral, Qwen2/3, SmolLM, ...) calls its modeling module's
``apply_rotary_pos_emb(q, k, cos, sin)``: about fourteen small torch operations per layer (slices,
negations, concatenations, products, sums), which at a 512-token prefill took ~12 % of a step here.
:func:`enable` replaces that module-level function with :class:`FastRotary`, which runs the
one-pass kernel of :mod:`djl_handlers.kernels.rotary` — **bitwise torch's** result in fp32 and
bf16 — and hands every call it does not handle (another dtype or device, ``unsqueeze_dim`` other
than 1, extra arguments, autograd) to the original function.

The function is replaced in the modeling module (transformers looks it up there at call time), so
it applies to every model of that architecture in the process; that is why it must give the same
bits: before installing, the original and the kernel run on random inputs of the model's dtype
(contiguous and strided like fused projections' slices, several lengths) and must agree bit for
bit, else the module keeps its function. Which modules: those of the model's attention classes
whose ``forward`` calls ``apply_rotary_pos_emb`` and which define ``rotate_half`` (the formula the
kernel computes). :func:`disable` puts the originals back.
"""

from __future__ import annotations

import inspect
import logging
import sys
from typing import Any

import torch

from djl_handlers.kernels import rotary as kernel

LOG = logging.getLogger(__name__)

_NAME = "apply_rotary_pos_emb"


class FastRotary:
    """A modeling module's ``apply_rotary_pos_emb`` over the kernel, the original as fallback."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.__name__ = getattr(original, "__name__", _NAME)
        self.__doc__ = getattr(original, "__doc__", None)

    def __call__(self, q: Any, k: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any) -> Any:
        plain = (not args or (len(args) == 1 and args[0] == 1 and not kwargs)) and (
            not kwargs or (len(kwargs) == 1 and kwargs.get("unsqueeze_dim") == 1))
        if plain and isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor):
            out = kernel.rotary(q, k, cos, sin)
            if out is not None:
                return out
        return self.original(q, k, cos, sin, *args, **kwargs)


def modeling_modules(model: Any) -> list[Any]:
    """The modeling modules of ``model``'s attention classes that call ``apply_rotary_pos_emb``."""
    found: dict[str, Any] = {}
    for module in model.modules():
        forward = getattr(type(module), "forward", None)
        code = getattr(inspect.unwrap(forward), "__code__", None) if callable(forward) else None  # past decorators
        if code is None or _NAME not in code.co_names:
            continue
        owner = sys.modules.get(type(module).__module__)
        if (owner is not None and callable(getattr(owner, _NAME, None))
                and callable(getattr(owner, "rotate_half", None))):
            found[owner.__name__] = owner
    return list(found.values())


def matches(original: Any, dtype: torch.dtype, head_dim: int = 64, seed: int = 0) -> bool:
    """True when the kernel gives ``original``'s bits on random inputs of ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        for batch, seq, heads, kv_heads in ((2, 5, 4, 2), (3, 1, 9, 3), (1, 37, 2, 1)):
            fused = torch.randn(batch, seq, (heads + kv_heads) * head_dim, generator=gen).to(dtype)
            q = fused[..., : heads * head_dim].view(batch, seq, heads, head_dim).transpose(1, 2)  # strided
            k = fused[..., heads * head_dim:].view(batch, seq, kv_heads, head_dim).transpose(1, 2)
            angles = torch.rand(batch, seq, head_dim, generator=gen) * 20
            cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
            for qq, kk in ((q, k), (q.contiguous(), k.contiguous())):
                want = original(qq, kk, cos, sin)
                got = kernel.rotary(qq, kk, cos, sin)
                if got is None or not all(torch.equal(a, b) for a, b in zip(want, got, strict=True)):
                    return False
    return True


def enable(model: Any) -> int:
    """Install :class:`FastRotary` in the modeling modules of ``model`` where the kernel gives the
    original's bits in the model's dtype; returns how many modules use it (0 when the kernel cannot
    be built, logged)."""
    if not kernel.available():
        LOG.debug("option.cpu_rotary=fused: the rotary kernel cannot be built here (%s); using torch's",
                 kernel.unavailable_reason())
        return 0
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if dtype not in (torch.float32, torch.bfloat16):
        return 0
    head_dim = int(getattr(getattr(model, "config", None), "head_dim", 0) or 64)
    count = 0
    for owner in modeling_modules(model):
        current = getattr(owner, _NAME)
        original = current.original if isinstance(current, FastRotary) else current
        if not matches(original, dtype, head_dim if head_dim % 2 == 0 else 64):
            LOG.debug("option.cpu_rotary: %s.%s does not compute what the kernel computes; kept",
                     owner.__name__, _NAME)
            continue
        if not isinstance(current, FastRotary):
            setattr(owner, _NAME, FastRotary(original))
        count += 1
    return count


def disable(model: Any) -> int:
    """Put back the original ``apply_rotary_pos_emb`` of ``model``'s modeling modules."""
    count = 0
    for owner in modeling_modules(model):
        current = getattr(owner, _NAME)
        if isinstance(current, FastRotary):
            setattr(owner, _NAME, current.original)
            count += 1
    return count
