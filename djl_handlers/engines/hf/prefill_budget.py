"""The HF engine's device-dependent default: how many prompt tokens a step prefills when
``option.max_prefill_tokens`` is unset.

On the CPU a prefill is compute-bound and 2048 padded tokens per step measured best on a burst
(docs/benchmarks.md, "What the defaults rest on"). On a GPU a step is bound by the CPU launching
kernels, so a larger prefill costs little more than a small one: a GPU with at least 70 GiB of
memory (H100/H200 class) takes 8192 tokens per step, vLLM's own API-server default for that class;
smaller GPUs keep 2048, as vLLM does for them (a larger step would hold the running rows' next token
longer for little gain, and needs the activation memory of every prompt token at once).
"""

from __future__ import annotations

from typing import Any

from djl_handlers.config.hf import DEFAULT_PREFILL_TOKENS

__all__ = ["LARGE_GPU_BYTES", "LARGE_GPU_PREFILL_TOKENS", "default_prefill_tokens"]

LARGE_GPU_BYTES = 70 * 2**30
LARGE_GPU_PREFILL_TOKENS = 8192


def default_prefill_tokens(device: Any) -> int:
    """The prefill budget for a model on ``device`` (a ``torch.device``) when the option is unset."""
    if getattr(device, "type", str(device)) != "cuda":
        return DEFAULT_PREFILL_TOKENS
    import torch

    total = int(torch.cuda.get_device_properties(device).total_memory)
    return LARGE_GPU_PREFILL_TOKENS if total >= LARGE_GPU_BYTES else DEFAULT_PREFILL_TOKENS
