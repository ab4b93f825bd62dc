"""The KV cache's element type (``option.kv_cache_dtype``, vLLM's name) for the transformers engine.

``auto`` keeps keys and values in the model's dtype. ``float16`` or ``bfloat16`` under fp32 weights
stores them in 16 bits, as llama.cpp does by default (its F16 KV cache): the cache takes half the
memory, so twice the tokens fit a ``kv_cache_memory_bytes`` bound, and a decode step reads half the KV
bytes. The model still computes in fp32: each new key and value is rounded to 16 bits when the slab
stores it, and the ragged attention kernel (:mod:`djl_handlers.engines.hf.cpu.ragged_attention`)
reads them back widened to fp32. The greedy texts then agree with fp32's where fp32 is decided by a
margin, not bit for bit (docs/engines.md gives the measured agreement), which is why it is opt-in.

Where it applies: a model computing in fp32 whose attention is the ragged CPU kernel (the default
``option.cpu_attention=auto`` on a CPU, where the kernel builds). Anywhere else it is refused at load
with what to change: torch's SDPA needs one dtype for the query and the cache, and a 16-bit model
already keeps a 16-bit cache.
"""

from __future__ import annotations

from typing import Any

import torch

from djl_handlers.errors import ConfigError

__all__ = ["DTYPES", "resolve_kv_dtype"]

FIELD = "option.kv_cache_dtype"
DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_kv_dtype(name: str, model: Any) -> torch.dtype | None:
    """The slab's element type for ``option.kv_cache_dtype=name`` on ``model``: None when the cache
    keeps the model's own dtype (``auto``, or the model's dtype named), else the 16-bit type; a
    :class:`ConfigError` naming the option where a 16-bit cache cannot apply."""
    if name == "auto":
        return None
    dtype = DTYPES[name]
    weights = next(p for p in model.parameters() if p.is_floating_point())
    if weights.dtype == dtype:
        return None
    if weights.dtype != torch.float32:
        raise ConfigError(f"{FIELD}={name} under {str(weights.dtype).removeprefix('torch.')} weights: a KV cache "
                          "of another type than the model's is supported under fp32 weights only; use auto",
                          field=FIELD)
    from djl_handlers.engines.hf.cpu.ragged_attention import ATTN_NAME

    if weights.device.type != "cpu" or getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
        raise ConfigError(f"{FIELD}={name} needs the ragged attention kernel on the CPU, which reads a 16-bit "
                          "cache under fp32 queries (option.cpu_attention=auto or ragged, a model on the CPU "
                          "using sdpa attention); this model's attention is "
                          f"{getattr(model.config, '_attn_implementation', None)!r} on {weights.device.type}: "
                          "use auto", field=FIELD)
    return dtype
