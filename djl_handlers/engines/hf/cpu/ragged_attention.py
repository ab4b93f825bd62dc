"""Attention over each row's real tokens only, for HF models on the CPU (``option.cpu_attention``).

A decode step of the padded engine runs one query per row against a left-padded cache of width
``T``; torch's SDPA reads all ``T`` columns of every row, padding included (44 % of the cells on the
benchmark workload), and its bf16 CPU path is slower than its fp32 one. A prefill group is padded
to its longest prompt and needs SDPA's explicit-mask path (and a copy of the grouped key/value
heads). The kernel in :mod:`djl_handlers.kernels.decode_attention` attends, for each query, to its
row's columns ``[start, own column]`` only, reads a grouped key/value head once for all its query
heads, and never depends on the other rows or on the padding: a request gets the same bits alone
as in any batch or prefill group.

Wiring: :func:`enable` registers :func:`ragged_attention` with transformers under
:data:`ATTN_NAME` (with SDPA's own mask builder) and makes it the model's attention. Every call on
the CPU of a causal layer derives the rows' starts from the boolean mask SDPA would have got (once
per forward: all layers share the mask object; a prompt's mask is checked to be exactly "padding,
then causal") and runs the kernel; anything else (other masks, non-causal layers, soft-capping,
attention sinks, sliding windows, dropout, other devices) goes to transformers' SDPA function
unchanged (keys and values of a 16-bit cache under fp32 queries, ``option.kv_cache_dtype``, widened
to the query's dtype first: the kernel reads them as they are). ``generate()`` on the same model
object takes the same path.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

ATTN_NAME = "djl_ragged"
_FALLBACK_KWARGS = ("softcap", "s_aux", "sliding_window", "position_bias")

_registered = False
_last: tuple[Any, torch.Tensor | None] | None = None  # (weakref to the last mask seen, its starts)


def _sdpa(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


def starts_from_mask(mask: torch.Tensor | None, rows: int, width: int, queries: int = 1) -> torch.Tensor | None:
    """Each row's first real column when ``mask`` ([rows, 1, queries, width] bool, True = attend) is
    "padding, then causal over the tokens" for the last ``queries`` columns (a query in the padding
    may see anything: SDPA's mask builder unmasks such rows to avoid NaNs); zeros when there is no
    mask; None when the mask is anything else."""
    if mask is None:
        return torch.zeros(rows, dtype=torch.int64)
    if mask.dtype != torch.bool or mask.dim() != 4 or tuple(mask.shape) != (rows, 1, queries, width):
        return None
    global _last
    cached = _last
    if cached is not None and cached[0]() is mask:  # a later layer of the same forward
        return cached[1]
    flat = mask[:, 0, -1]  # the last query sees every real column of its row
    count = flat.sum(dim=1)
    tail: torch.Tensor = width - count  # where the row's tokens would start if they are contiguous
    first = flat.int().argmax(dim=1)  # first True (0 for a row of all False)
    ragged = not bool((count == 0).any()) and torch.equal(first, tail)
    if ragged and queries > 1:
        columns = torch.arange(width, device=mask.device)
        position = columns[width - queries :].view(1, queries, 1)  # each query's own column
        padding = position < tail.view(rows, 1, 1)  # queries left of the row's first token
        expected = (columns >= tail.view(rows, 1, 1)) & (columns <= position)
        ragged = torch.equal(mask[:, 0] | padding, expected | padding)
    starts = tail if ragged else None
    _last = (weakref.ref(mask), starts)
    return starts


def ragged_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` [B, H, q, D], ``key``/``value``
    [B, H_kv, T, D] → ([B, q, H, D], None). Prompts (q > 1) run causal over the row's tokens, which
    needs the layer to be causal (``is_causal``) and, without a mask, means no padding."""
    rows, heads, q_len, dim = query.shape
    causal = q_len == 1 or (kwargs.get("is_causal") is not False and getattr(module, "is_causal", True))
    if (
        causal
        and query.device.type == "cpu"
        and dropout == 0.0
        and not any(kwargs.get(name) is not None for name in _FALLBACK_KWARGS)
    ):
        starts = starts_from_mask(attention_mask, rows, key.shape[2], q_len)
        if starts is not None:
            from djl_handlers.kernels.decode_attention import attention

            scale = scaling if scaling is not None else dim**-0.5
            out = attention(query, key, value, starts, scale)
            if out is not None:
                return out, None
    if key.dtype != query.dtype:  # a 16-bit cache under fp32 queries (option.kv_cache_dtype): SDPA needs one dtype
        key, value = key.to(query.dtype), value.to(query.dtype)
    return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def register() -> None:
    """Register :func:`ragged_attention` (with SDPA's mask builder) with transformers, once."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, ragged_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
    _registered = True


def enable(model: Any) -> bool:
    """Make :func:`ragged_attention` the attention of ``model`` (a CPU model using SDPA) when the
    kernel builds here. Returns whether it was enabled."""
    from djl_handlers.kernels.decode_attention import available

    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa" or not available():
        return False
    register()
    config._attn_implementation = ATTN_NAME
    return True


def disable(model: Any) -> None:
    """Give ``model`` back torch's SDPA attention."""
    if getattr(model.config, "_attn_implementation", None) == ATTN_NAME:
        model.config._attn_implementation = "sdpa"
