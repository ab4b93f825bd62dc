"""Batch layouts for :mod:`djl_handlers.engines.hf_engine`: the running batch's KV cache, and
the padded batches and outputs of the static ``generate()`` path.

Rows are left-padded to a common length ``T``. Per layer, keys/values live in a preallocated
slab ``[B, kv_heads, capacity, head_dim]``; the cache exposes the view ``[:, :, :T]``. A decode
step writes one column in place instead of concatenating (``DynamicLayer`` copies the whole
cache on every token), and the slab grows by ``GROW`` columns when full.

``KVBatch`` holds the slab cache plus the per-row tensors the engine needs: ``mask`` [B, T]
(1 = real token), ``pos`` [B] (true length = position id of the pending token) and ``pending``
[B] (the last sampled token, fed at the next decode). It selects rows (release), trims the
left padding nobody needs any more, and merges newly prefilled rows (zero-padded, masked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from djl_handlers.engines.base import StepOutput

GROW = 128  # columns added to a full slab (amortises reallocation to one copy per GROW tokens)


class SlabLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values are views into a preallocated, growable slab."""

    def __init__(self) -> None:
        super().__init__()
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._len = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new columns in place (growing the slab if needed); return the views."""
        if self._k is None:
            self.is_initialized = True
            self.device = key_states.device
            self.adopt(key_states, value_states)
            return self.views()
        need = self._len + key_states.shape[-2]
        if need > self._k.shape[-2] or key_states.shape[0] != self._k.shape[0]:
            self.adopt(*self.views(), extra=need - self._len)
        assert self._k is not None and self._v is not None
        self._k[:, :, self._len : need] = key_states
        self._v[:, :, self._len : need] = value_states
        self._set_len(need)
        return self.views()

    def views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The current ``(keys, values)`` views (only valid once the layer holds data)."""
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, extra: int = 0) -> None:
        """Copy ``keys``/``values`` into a fresh slab with room for ``extra`` + ``GROW`` columns."""
        self.adopt_parts([(keys, values)], keys.shape[-2], extra)

    def adopt_parts(self, parts: list[tuple[torch.Tensor, torch.Tensor]], width: int, extra: int = 0) -> None:
        """Stack row groups ``parts`` into one fresh slab, each right-aligned to ``width`` columns
        (zeros on the left of shorter groups): one copy, no intermediate concatenation."""
        first_k, first_v = parts[0]
        rows = sum(k.shape[0] for k, _ in parts)
        _, h, _, d = first_k.shape
        capacity = width + extra + GROW
        self._k = first_k.new_empty((rows, h, capacity, d))
        self._v = first_v.new_empty((rows, h, capacity, first_v.shape[-1]))
        start = 0
        for keys, values in parts:
            end, n = start + keys.shape[0], keys.shape[-2]
            if n < width:
                self._k[start:end, :, : width - n].zero_()
                self._v[start:end, :, : width - n].zero_()
            self._k[start:end, :, width - n : width] = keys
            self._v[start:end, :, width - n : width] = values
            start = end
        self.is_initialized = True
        self.device = first_k.device
        self._set_len(width)

    def _set_len(self, n: int) -> None:
        assert self._k is not None and self._v is not None
        self._len = n
        self.keys = self._k[:, :, :n]
        self.values = self._v[:, :, :n]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only ``indices`` rows (a new, compact slab)."""
        if self._k is not None:
            keys, values = self.views()
            self.adopt(keys[indices], values[indices])

    def crop_left(self, n: int) -> None:
        """Drop the first ``n`` columns (common left padding)."""
        if self._k is not None and n > 0:
            keys, values = self.views()
            self.adopt(keys[:, :, n:], values[:, :, n:])

    def reset(self) -> None:
        """Forget everything."""
        self._k = self._v = None
        self._len = 0
        super().reset()


def new_slab_cache(config: Any) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose layers are :class:`SlabLayer`."""
    cache = DynamicCache(config=config)
    cache.layers = [SlabLayer() for _ in cache.layers]
    return cache


def uses_plain_layers(config: Any) -> bool:
    """True when every cache layer of the model is a full-attention ``DynamicLayer``."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


@dataclass
class KVBatch:
    """A left-padded batch: slab cache, mask, positions, pending tokens and row payloads."""

    cache: DynamicCache
    mask: torch.Tensor
    pos: torch.Tensor
    pending: torch.Tensor
    rows: list[Any] = field(default_factory=list)

    @property
    def layers(self) -> list[SlabLayer]:
        """The cache's layers (always :class:`SlabLayer`: see ``new_slab_cache``)."""
        return cast("list[SlabLayer]", self.cache.layers)

    @property
    def width(self) -> int:
        """The padded length ``T``."""
        return int(self.mask.shape[1])

    def select(self, keep: list[int]) -> None:
        """Keep rows ``keep`` (in order) and trim the left padding no remaining row needs."""
        if len(keep) == len(self.rows):
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        for layer in self.layers:
            layer.batch_select_indices(idx)
        self.mask, self.pos, self.pending = self.mask[idx], self.pos[idx], self.pending[idx]
        self.rows = [self.rows[i] for i in keep]
        used = self.mask.any(dim=0)
        lead = int(used.int().argmax()) if bool(used.any()) else 0
        if lead > 0:
            for layer in self.layers:
                layer.crop_left(lead)
            self.mask = self.mask[:, lead:]

    def kv_bytes(self) -> tuple[int, int]:
        """(bytes holding real tokens, bytes allocated) over every slab layer; padding columns and
        the slab's spare ``GROW`` columns count as allocated but unused."""
        allocated = used = 0
        real = int(self.mask.sum())
        for layer in self.cache.layers:
            k, v = getattr(layer, "_k", None), getattr(layer, "_v", None)
            if k is None or v is None:
                continue
            size = k.numel() * k.element_size() + v.numel() * v.element_size()
            slots = k.shape[0] * k.shape[2]  # rows x capacity
            allocated += size
            used += size * real // slots if slots else 0
        return used, allocated

    def grow_mask(self) -> None:
        """Append one real column to the mask (before a decode forward)."""
        ones = torch.ones((self.mask.shape[0], 1), dtype=self.mask.dtype, device=self.mask.device)
        self.mask = torch.cat([self.mask, ones], dim=1)

    def merge(self, other: KVBatch) -> None:
        """Append ``other``'s rows, left-padding the shorter side with zeros (masked out)."""
        width = max(self.width, other.width)
        for a, b in zip(self.layers, other.layers, strict=True):
            a.adopt_parts([a.views(), b.views()], width)
        self.mask = torch.cat([pad_left(self.mask, width, 1), pad_left(other.mask, width, 1)], dim=0)
        self.pos = torch.cat([self.pos, other.pos])
        self.pending = torch.cat([self.pending, other.pending])
        self.rows = self.rows + other.rows


def pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zero-pad ``t`` on the left of ``dim`` up to ``width``."""
    extra = width - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` [n, longest] for ``prompts``, padded on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        if len(prompt):
            ids[i, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
    return ids, mask


def generate_key(settings: Mapping[str, Any], seed: int | None) -> tuple[tuple[str, Any], ...]:
    """``generate()`` keyword arguments from a request's ``to_hf``/``to_deepspeed`` ``settings``
    (plus ``seed`` when sampling): hashable, so requests with equal keys share one ``generate()``
    call. ``max_new_tokens`` is not part of it (outputs are cut to each request's own limit)."""
    kwargs = {k: v for k, v in settings.items() if k != "max_new_tokens"}
    if kwargs["do_sample"]:
        kwargs["seed"] = seed
    return tuple(sorted(kwargs.items()))


def static_outputs(
    request_ids: Sequence[int],
    new_tokens: torch.Tensor,
    step_logits: Sequence[torch.Tensor],
    limits: Sequence[int],
    eos_ids: frozenset[int],
) -> list[list[StepOutput]]:
    """Per-request token outputs of one ``generate()`` call, each cut at its own ``limits[i]``
    and first eos; log-probs from the raw per-step logits; ``finish_reason`` on the last one."""
    columns = []
    for t, logits in enumerate(step_logits):  # one [n, vocab] tensor per step: no big stack
        x = logits.float()
        picked = x.gather(1, new_tokens[:, t : t + 1]).squeeze(1)
        columns.append(picked - torch.logsumexp(x, dim=-1))
    log_probs = torch.stack(columns, dim=1).tolist() if columns else [[] for _ in request_ids]
    results = []
    for i, rid in enumerate(request_ids):
        outs: list[StepOutput] = []
        for tok, lp in zip(new_tokens[i].tolist()[: limits[i]], log_probs[i], strict=False):
            outs.append(StepOutput(rid, token_id=tok, log_prob=lp))
            if tok in eos_ids:
                break
        if outs:
            last = outs[-1]
            reason = "eos_token" if last.token_id in eos_ids else "length"
            outs[-1] = StepOutput(rid, last.token_id, last.log_prob, finish_reason=reason)
        results.append(outs)
    return results
