"""Fused RMSNorm for HF models on the CPU (``option.cpu_norm``).

Llama-family models (Llama, Mistral, Qwen2/3, SmolLM, ...) normalise twice per decoder layer and
once at the end; ``LlamaRMSNorm.forward`` is about eight small torch operations (to fp32, pow,
mean, add eps, rsqrt, mul, back to the model dtype, mul by the weight), each a separate pass and
dispatch. :func:`fuse_rms_norms` gives each such module a :class:`FusedRMSNorm` forward that runs
the one-pass C kernel of :mod:`djl_handlers.kernels.rms_norm`, which reproduces torch's result bit
for bit (fp32 and bf16).

Which modules: class name ending in ``RMSNorm``, a 1-D ``weight`` and a numeric
``variance_epsilon`` (or ``eps``). The formula is not trusted from the name: before a module is
switched, its original forward and the kernel run on random rows of the module's dtype (several
scales, 2-D and 3-D) and must agree bit for bit; a norm computing something else — Gemma's
``x * (1 + weight)`` in fp32, an added bias, another eps placement — fails this check and keeps
its own forward. (A random check cannot prove two formulas equal everywhere; it rejects every
variant that changes the arithmetic.)

Like :mod:`~djl_handlers.engines.hf.cpu.linear`, only ``forward`` is replaced on the instance:
the module, its weight, hooks and ``state_dict`` stay. At call time, inputs the kernel refuses
(another dtype or device, autograd on, extra arguments) go to the original forward.
:func:`unfuse_rms_norms` undoes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from djl_handlers.kernels import rms_norm as kernel

LOG = logging.getLogger(__name__)

_CHECK_SCALES = (1e-3, 1.0, 30.0)


class FusedRMSNorm:
    """The ``forward`` of one RMSNorm module over the fused kernel."""

    def __init__(self, module: torch.nn.Module, original: Callable[..., Any], eps: float,
                 previous: Any = None) -> None:
        self.module: Any = module
        self.original = original
        self.eps = eps
        self.previous = previous  # the instance's own ``forward`` before fusing (None: the class's)

    def __call__(self, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs and isinstance(hidden_states, torch.Tensor):
            out = kernel.rms_norm(hidden_states, self.module.weight, self.eps)
            if out is not None:
                return out
        return self.original(hidden_states, *args, **kwargs)


def _eps(module: torch.nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def candidate(module: torch.nn.Module) -> bool:
    """True for a module shaped like a Llama RMSNorm (the name, a 1-D weight, an eps)."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__.endswith("RMSNorm") and isinstance(weight, torch.Tensor)
            and weight.dim() == 1 and weight.shape[0] > 0 and _eps(module) is not None)


def matches(module: torch.nn.Module, original: Callable[..., Any], eps: float, seed: int = 0) -> bool:
    """True when the kernel gives the same bits as ``original`` on random inputs of the module's
    dtype: a few rows at several scales, a 3-D batch and a single row."""
    weight = module.weight
    if not isinstance(weight, torch.Tensor) or weight.device.type != "cpu" or weight.dtype not in kernel.DTYPES:
        return False
    hidden = weight.shape[0]
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(3, hidden, generator=gen) * scale for scale in _CHECK_SCALES]
    inputs += [torch.randn(2, 5, hidden, generator=gen), torch.randn(1, hidden, generator=gen)]
    with torch.no_grad():
        for x in inputs:
            x = x.to(weight.dtype)
            want = original(x)
            got = kernel.rms_norm(x, weight, eps)
            if got is None or not isinstance(want, torch.Tensor) or want.dtype != got.dtype:
                return False
            if want.shape != got.shape or not torch.equal(want, got):
                return False
    return True


def fuse_rms_norms(model: Any) -> int:
    """Give every Llama-style RMSNorm of ``model`` that passes :func:`matches` a
    :class:`FusedRMSNorm` forward; returns how many (0 when the kernel cannot be built here)."""
    if not kernel.available():
        LOG.debug("option.cpu_norm=fused: the RMSNorm kernel cannot be built here (%s); using torch's",
                 kernel.unavailable_reason())
        return 0
    if kernel.lanes() is None:
        LOG.debug("option.cpu_norm=fused: the RMSNorm kernel does not reproduce this torch's sums; using torch's")
        return 0
    count = 0
    rejected: set[str] = set()
    unsupported: set[str] = set()
    for name, module in model.named_modules():
        if not candidate(module) or isinstance(module.__dict__.get("forward"), FusedRMSNorm):
            continue
        eps = _eps(module)
        assert eps is not None  # candidate() checked it
        if module.weight.device.type != "cpu" or module.weight.dtype not in kernel.DTYPES:
            unsupported.add(f"{type(module).__name__} ({module.weight.dtype}, {module.weight.device.type})")
            continue
        previous = module.__dict__.get("forward")
        original = module.forward
        if not matches(module, original, eps):
            rejected.add(type(module).__name__)
            LOG.debug("option.cpu_norm: %s (%s) does not compute Llama's RMSNorm; kept", name, type(module).__name__)
            continue
        module.forward = FusedRMSNorm(module, original, eps, previous)
        count += 1
    if unsupported:
        LOG.debug("option.cpu_norm: the kernel handles fp32/bf16 on the CPU; kept torch's forward for %s",
                 ", ".join(sorted(unsupported)))
    if rejected:
        LOG.debug("option.cpu_norm: kept torch's forward for %s (not Llama's RMSNorm formula)",
                 ", ".join(sorted(rejected)))
    return count


def unfuse_rms_norms(model: Any) -> int:
    """Undo :func:`fuse_rms_norms` (the forward each module had before); returns how many."""
    count = 0
    for module in model.modules():
        fused = module.__dict__.get("forward")
        if isinstance(fused, FusedRMSNorm):
            if fused.previous is None:
                del module.forward
            else:
                module.forward = fused.previous
            count += 1
    return count
