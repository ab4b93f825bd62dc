"""Attention over a packed (ragged) step for :mod:`djl_handlers.engines.hf_packed`.

The packed step runs the model once on ``input_ids [1, N]``: the pending token of every decoding
request followed by the prompt chunks being prefilled, each token with its own position id. The
model's own layers (embeddings, rotary, MLPs, norms, LM head) see an ordinary batch of one; only
attention has to know which tokens belong together. transformers 5 resolves a layer's attention
function by name at every forward (``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``) and
passes the forward's extra keyword arguments through to it, so :func:`packed_attention` is
registered under :data:`ATTN_NAME` and gets the step's :class:`PackedMeta` as ``djl_packed=``.
The engine switches ``config._attn_implementation`` to it only for the duration of a packed
forward (:func:`packed_mode`), so ``generate()`` on the same model object is untouched.

Per layer, :func:`packed_attention`

1. writes the N new keys/values into their requests' slots (:class:`~.hf_paged_kv.SlotKV`), one
   indexed store;
2. decode tokens: one SDPA call, queries scattered into their slots ``[span, ...]``, over the slab
   view ``[:span, :, :longest]`` with a length mask (no KV copy);
3. each prefill chunk: one SDPA call over its slot's columns ``[0, start + n)``, causal
   (``is_causal`` for a first chunk, an explicit offset mask for a later one).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from djl_handlers.engines.hf_paged_kv import SlotKV

ATTN_NAME = "djl_packed"


@dataclass
class Segment:
    """A prefill chunk: tokens ``[tok, tok + n)`` of the pack go to ``slot`` columns ``[start, start + n)``."""

    tok: int
    n: int
    slot: int
    start: int
    mask: torch.Tensor | None = None  # [n, start + n] bool, only for a later chunk (start > 0)


@dataclass
class PackedMeta:
    """Everything the attention layers need about one packed step (built once, shared by all layers)."""

    kv: SlotKV
    slots: torch.Tensor  # [N] slot of each packed token
    cols: torch.Tensor  # [N] column (= position) of each packed token
    dec_tok: torch.Tensor  # [B] pack index of each decode token (pack order: decode tokens first)
    dec_slots: torch.Tensor  # [B] their slots
    dec_mask: torch.Tensor | None  # [span, 1, 1, longest] bool: column < the slot's length
    span: int = 0
    longest: int = 0
    index: torch.Tensor | None = None  # [N * kv_heads] flat slab rows of the new keys/values
    segments: list[Segment] = field(default_factory=list)


def build_meta(
    kv: SlotKV,
    decode: list[tuple[int, int]],
    chunks: list[tuple[int, int, int]],
    device: torch.device,
) -> PackedMeta:
    """``decode``: (slot, column of the pending token) per decoding row, in pack order; ``chunks``:
    (slot, first column, token count) per prefill chunk, packed after the decode tokens."""
    slots = [s for s, _ in decode]
    cols = [c for _, c in decode]
    segments = []
    tok = len(decode)
    for slot, start, n in chunks:
        seg = Segment(tok, n, slot, start)
        if start > 0:
            q = torch.arange(start, start + n, device=device).unsqueeze(1)
            seg.mask = torch.arange(start + n, device=device).unsqueeze(0) <= q
        segments.append(seg)
        slots += [slot] * n
        cols += list(range(start, start + n))
        tok += n
    meta = PackedMeta(
        kv,
        torch.tensor(slots, dtype=torch.long, device=device),
        torch.tensor(cols, dtype=torch.long, device=device),
        torch.arange(len(decode), device=device),
        torch.tensor([s for s, _ in decode], dtype=torch.long, device=device),
        None,
        segments=segments,
    )
    if decode:
        meta.span = max(s for s, _ in decode) + 1
        meta.longest = max(c for _, c in decode) + 1
        lengths = torch.ones(meta.span, dtype=torch.long, device=device)  # an idle slot sees column 0 only
        lengths[meta.dec_slots] = meta.cols[: len(decode)] + 1
        meta.dec_mask = (torch.arange(meta.longest, device=device) < lengths.unsqueeze(1)).view(
            meta.span, 1, 1, meta.longest
        )
    return meta


def packed_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``query`` [1, heads, N, d], ``key``/``value`` [1, kv_heads, N, d] → output [1, N, heads, d]."""
    meta: PackedMeta | None = kwargs.get("djl_packed")
    if meta is None:
        raise RuntimeError(f"the {ATTN_NAME!r} attention needs a packed step (djl_packed=...)")
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None or kwargs.get("sliding_window"):
        raise RuntimeError("packed attention supports plain softmax attention only")
    layer = int(module.layer_idx)
    kv = meta.kv
    if meta.index is None:  # the slabs exist by now (the engine reserved them): index once per step
        meta.index = kv.flat_index(meta.slots, meta.cols)
    kv.write(layer, meta.index, key[0].transpose(0, 1), value[0].transpose(0, 1))
    keys, values = kv.keys[layer], kv.values[layer]
    heads, n_tok, dim = query.shape[1], query.shape[2], query.shape[3]
    kv_heads = keys.shape[1]
    rep = heads // kv_heads
    out = query.new_empty((n_tok, heads, values.shape[-1]))
    n_dec = int(meta.dec_tok.numel())
    if n_dec:
        # one query per row: fold the heads sharing a KV head into the query axis (no repeat of KV)
        q = query[0, :, :n_dec].transpose(0, 1)  # [B, heads, d]
        if meta.span == n_dec and bool((meta.dec_slots == meta.dec_tok).all()):
            qs = q
        else:
            qs = query.new_zeros((meta.span, heads, dim))
            qs[meta.dec_slots] = q
        o = F.scaled_dot_product_attention(
            qs.view(meta.span, kv_heads, rep, dim),
            keys[: meta.span, :, : meta.longest],
            values[: meta.span, :, : meta.longest],
            attn_mask=meta.dec_mask,
            scale=scaling,
        )  # [span, kv_heads, rep, d]
        o = o.reshape(meta.span, heads, -1)
        out[:n_dec] = o if qs is q else o[meta.dec_slots]
    for seg in meta.segments:
        end = seg.start + seg.n
        k = keys[seg.slot : seg.slot + 1, :, :end]
        v = values[seg.slot : seg.slot + 1, :, :end]
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(
            query[:, :, seg.tok : seg.tok + seg.n],
            k,
            v,
            attn_mask=seg.mask,
            is_causal=seg.mask is None,
            scale=scaling,
        )  # [1, heads, n, d]
        out[seg.tok : seg.tok + seg.n] = o[0].transpose(0, 1)
    return out.unsqueeze(0), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """Mask builder for :data:`ATTN_NAME`: the packed attention builds its own masks."""
    return None


_registered = False


def register() -> None:
    """Register :func:`packed_attention` (and a no-op mask builder) with transformers, once."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, packed_attention)
    AttentionMaskInterface.register(ATTN_NAME, _no_mask)
    _registered = True


@contextmanager
def packed_mode(model: Any) -> Iterator[None]:
    """Use :func:`packed_attention` for the forwards inside the block, then restore the model's own."""
    register()
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = ATTN_NAME
    try:
        yield
    finally:
        config._attn_implementation = before
