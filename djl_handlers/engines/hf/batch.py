"""Batch layouts for :mod:`djl_handlers.engines.hf.engine`: the running batch's KV cache, and
the padded batches and outputs of the static ``generate()`` path.

Rows are left-padded to a common length ``T``. Per layer, keys/values live in a preallocated
slab with spare rows and spare columns on both sides; the cache exposes the view of the rows and
columns in use (see :class:`SlabLayer`). A decode step writes one column in place instead of
concatenating (``DynamicLayer`` copies the whole cache on every token); a join copies only the new
rows, a leave only the rows moved into the holes, and the slab grows by ``GROW`` columns when full.
Under ``option.kv_cache_memory_bytes`` the slabs' allocated capacity, spare included, stays within the
bound (:mod:`djl_handlers.engines.hf.slab_ledger`).

``KVBatch`` holds the slab cache plus the per-row tensors the engine needs: ``mask`` [B, T]
(1 = real token), ``pos`` [B] (true length = position id of the pending token) and ``pending``
[B] (the last sampled token, fed at the next decode). It selects rows (release), trims the
left padding nobody needs any more, merges newly prefilled rows (zero-padded, masked) and repeats a
prefilled row for the further samples of its prompt (``n``/``best_of``) or its beams, whose rows it
copies onto each other as the beams move (``copy_rows``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from djl_handlers.engines.base import StepOutput
from djl_handlers.engines.hf.sampling import log_normalizer
from djl_handlers.engines.hf.slab_ledger import SlabGroup, SlabLedger

GROW = 128  # columns added to a full slab (amortises reallocation to one copy per GROW tokens)


class SlabLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values are views into a preallocated, growable slab.

    The slab is ``[row capacity, kv_heads, column capacity, head_dim]``; the layer exposes rows
    ``[:rows]`` and columns ``[start:end]``. Room is kept on both sides of the columns: decode
    writes at ``end``; a merged prompt longer than the batch moves ``start`` left; trimming common
    left padding moves it right. Rows join into spare row slots and leave by moving the last rows
    into their holes (:meth:`move_rows`), so a join or a leave copies only the rows that move,
    never the whole cache. A slab is reallocated (one copy) only when it runs out of room. Spare
    capacity is allocated but untouched: on the CPU it costs address space until used, on a GPU real
    memory, so under a bound (``ledger``, :mod:`djl_handlers.engines.hf.slab_ledger`) a slab takes spare
    room only from what the bound leaves beside the other slabs and the mirror (:meth:`_fit`).
    """

    def __init__(self, ledger: SlabLedger | None = None, group: SlabGroup | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.dtype = dtype  # the slab's element type (option.kv_cache_dtype); None: the model's keys' own
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._rows = 0
        self._start = 0
        self._end = 0
        self.ledger = ledger  # the engine's ledger under option.kv_cache_memory_bytes (None: no limit)
        self.group = group if group is not None else SlabGroup(1)
        self.capacity_bytes = 0  # bytes of the slab's keys and values, spare rows and columns included
        if ledger is not None:
            ledger.register(self)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new columns in place (growing the slab if needed); return the views."""
        if self._k is None:
            self.is_initialized = True
            self.device = key_states.device
            self.adopt(key_states, value_states)
            return self.views()
        if key_states.shape[0] != self._rows:
            raise ValueError(f"a cache of {self._rows} rows was given keys for {key_states.shape[0]} rows")
        more = key_states.shape[-2]
        if self._end + more > self._cap_k().shape[-2]:
            self._grow((self._rows, self._cap_k().shape[0]), (0, self._start), (more, more + GROW))
        need = self._end + more  # the content may have moved left
        k, v = self._cap_k(), self._cap_v()
        k[: self._rows, :, self._end : need] = key_states
        v[: self._rows, :, self._end : need] = value_states
        self._set(self._rows, self._start, need)
        return self.views()

    def views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The current ``(keys, values)`` views (only valid once the layer holds data)."""
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def _cap_k(self) -> torch.Tensor:
        assert self._k is not None
        return self._k

    def _cap_v(self) -> torch.Tensor:
        assert self._v is not None
        return self._v

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, extra: int = 0) -> None:
        """Copy ``keys``/``values`` into a fresh slab with room for ``extra`` + ``GROW`` columns (as
        many of them as the ledger's bound leaves)."""
        rows, h, width, d = keys.shape
        dtype = self.dtype or keys.dtype
        element = torch.empty((), dtype=dtype).element_size()
        cell = (h * d + values.shape[1] * values.shape[-1]) * element
        _, _, right = self._fit((rows, rows), (0, 0), width, (0, extra + GROW), cell)
        self._k = keys.new_empty((rows, h, width + right, d), dtype=dtype)
        self._v = values.new_empty((rows, h, width + right, values.shape[-1]), dtype=dtype)
        self.capacity_bytes = self._k.numel() * self._k.element_size() + self._v.numel() * self._v.element_size()
        self._k[:, :, :width] = keys
        self._v[:, :, :width] = values
        self.is_initialized = True
        self.device = keys.device
        self._set(rows, 0, width)

    def append_rows(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add rows right-aligned with the current ones (zeros on the left of the narrower side);
        copies only the new rows unless the slab must grow."""
        if self._k is None:
            self.adopt(keys, values)
            return
        add, length = keys.shape[0], keys.shape[-2]
        width = self._end - self._start
        left = max(0, length - width)  # columns the existing rows gain on the left
        rows = self._rows + add
        cap_rows = self._cap_k().shape[0]
        if rows > cap_rows or left > self._start:
            room = self._cap_k().shape[-2] - self._end
            # generous spare room where the bound leaves it: few reallocations
            self._grow((rows, max(rows, 2 * cap_rows)), (left, left + max(GROW, width)), (0, max(room, GROW)))
        k, v = self._cap_k(), self._cap_v()
        start, end = self._start - left, self._end
        if left:
            k[: self._rows, :, start : self._start].zero_()
            v[: self._rows, :, start : self._start].zero_()
        new_k, new_v = k[self._rows : rows], v[self._rows : rows]
        new_k[:, :, start : end - length].zero_()
        new_v[:, :, start : end - length].zero_()
        new_k[:, :, end - length : end] = keys
        new_v[:, :, end - length : end] = values
        self._set(rows, start, end)

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy rows ``src`` over rows ``dst`` (the columns in use only)."""
        for slab in (self._cap_k(), self._cap_v()):
            part = slab[:, :, self._start : self._end]
            part[dst] = part[src]

    def keep_first(self, rows: int) -> None:
        """Expose only the first ``rows`` rows (the rest stay allocated as spare slots)."""
        self._set(rows, self._start, self._end)

    def drop_last(self, n: int) -> None:
        """Forget the last ``n`` columns (speculative candidates no row kept)."""
        if self._k is not None and n > 0:
            self._set(self._rows, self._start, self._end - n)

    def shift_row(self, row: int, n: int) -> None:
        """Move row ``row``'s columns in use ``n`` to the right (its last ``n`` are dropped), zeros
        entering on the left: a row that kept fewer speculative columns than others, realigned."""
        for slab in (self._cap_k(), self._cap_v()):
            part = slab[row, :, self._start : self._end]
            part[:, n:] = part[:, :-n].clone()
            part[:, :n].zero_()

    def _cell_bytes(self) -> int:
        """Bytes one (row, column) cell of this layer takes (keys and values)."""
        k, v = self._cap_k(), self._cap_v()
        return k.shape[1] * k.shape[3] * k.element_size() + v.shape[1] * v.shape[3] * v.element_size()

    def _grow(self, rows: tuple[int, int], left: tuple[int, int], right: tuple[int, int]) -> None:
        """Reallocate with ``rows`` row capacity and ``left``/``right`` spare columns around the content,
        each a ``(need, want)`` pair: the wants where the ledger's bound leaves room (see :meth:`_fit`)."""
        shape = self._fit(rows, left, self._end - self._start, right, self._cell_bytes())
        self._realloc(*shape)

    def _fit(self, rows: tuple[int, int], left: tuple[int, int], width: int, right: tuple[int, int],
             cell: int) -> tuple[int, int, int]:
        """``(rows, left, right)`` to allocate around ``width`` columns: the wants, or what the ledger's
        bound leaves (:meth:`~djl_handlers.engines.hf.slab_ledger.SlabLedger.shape`)."""
        if self.ledger is None:
            return rows[1], left[1], right[1]
        return self.ledger.shape(self.group, rows, left, width, right, cell)

    def compact(self) -> bool:
        """Give the spare room back: reallocate to exactly the rows and columns in use; whether it shrank."""
        if self._k is None:
            return False
        if self._k.shape[0] == self._rows and self._k.shape[2] == self._end - self._start:
            return False
        self._realloc(self._rows, 0, 0)
        return True

    def _realloc(self, cap_rows: int, left: int, right: int) -> None:
        """Move the content into a new slab with ``left``/``right`` spare columns around it."""
        k, v = self._cap_k(), self._cap_v()
        width = self._end - self._start
        _, h, _, d = k.shape
        new_k = k.new_empty((cap_rows, h, left + width + right, d))
        new_v = v.new_empty((cap_rows, h, left + width + right, v.shape[-1]))
        new_k[: self._rows, :, left : left + width] = k[: self._rows, :, self._start : self._end]
        new_v[: self._rows, :, left : left + width] = v[: self._rows, :, self._start : self._end]
        self._k, self._v = new_k, new_v
        self.capacity_bytes = new_k.numel() * new_k.element_size() + new_v.numel() * new_v.element_size()
        self._set(self._rows, left, left + width)

    def _set(self, rows: int, start: int, end: int) -> None:
        k, v = self._cap_k(), self._cap_v()
        self._rows, self._start, self._end = rows, start, end
        self.keys = k[:rows, :, start:end]
        self.values = v[:rows, :, start:end]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only ``indices`` rows, in that order (a new, compact slab)."""
        if self._k is not None:
            keys, values = self.views()
            self.adopt(keys[indices], values[indices])

    def crop_left(self, n: int) -> None:
        """Drop the first ``n`` columns (common left padding): the view starts later, no copy."""
        if self._k is not None and n > 0:
            self._set(self._rows, self._start + n, self._end)

    def allocated_bytes(self) -> int:
        """Bytes of the slab rows in use (all their columns, spare ones included)."""
        if self._k is None or self._v is None:
            return 0
        per_row = (self._k[0].numel() * self._k.element_size() + self._v[0].numel() * self._v.element_size())
        return self._rows * per_row

    def reset(self) -> None:
        """Forget everything."""
        self._k = self._v = None
        self._rows = self._start = self._end = 0
        self.capacity_bytes = 0
        super().reset()


def new_slab_cache(config: Any, ledger: SlabLedger | None = None, dtype: torch.dtype | None = None) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose layers are :class:`SlabLayer`, one group in ``ledger``,
    storing keys and values in ``dtype`` (None: the dtype the model gives them in)."""
    cache = DynamicCache(config=config)
    group = SlabGroup(len(cache.layers))
    cache.layers = [SlabLayer(ledger, group, dtype) for _ in cache.layers]
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
        """Keep rows ``keep`` and trim the left padding no remaining row needs. Rows past the
        kept count move into the holes left by dropped rows (only they are copied), so the row
        order changes; ``rows``, ``mask``, ``pos`` and ``pending`` stay aligned with the cache."""
        kept = sorted(set(keep))
        if len(kept) == len(self.rows):
            return
        count, kept_set = len(kept), set(kept)
        holes = [i for i in range(count) if i not in kept_set]
        movers = [i for i in kept if i >= count]
        order = list(range(count))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        device = self.mask.device
        src = torch.tensor(movers, dtype=torch.long, device=device)
        dst = torch.tensor(holes, dtype=torch.long, device=device)
        for layer in self.layers:
            if movers:
                layer.move_rows(src, dst)
            layer.keep_first(count)
        idx = torch.tensor(order, dtype=torch.long, device=device)
        self.mask, self.pos, self.pending = self.mask[idx], self.pos[idx], self.pending[idx]
        self.rows = [self.rows[i] for i in order]
        self.trim_left()

    def trim_left(self) -> None:
        """Drop the columns of left padding every row has."""
        used = self.mask.any(dim=0)
        lead = int(used.int().argmax()) if bool(used.any()) else 0
        if lead > 0:
            for layer in self.layers:
                layer.crop_left(lead)
            self.mask = self.mask[:, lead:]

    def repeat_rows(self, order: Sequence[int]) -> None:
        """Rebuild the batch as rows ``order`` of the current ones, an index possibly repeated:
        the samples of one prompt (``n``/``best_of``) start from copies of its prefilled KV row and
        each grows its own from there. ``rows`` is left to the caller (one payload per new row)."""
        idx = torch.tensor(list(order), dtype=torch.long, device=self.mask.device)
        for layer in self.layers:
            layer.batch_select_indices(idx)
        self.mask, self.pos, self.pending = self.mask[idx], self.pos[idx], self.pending[idx]

    def copy_rows(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Row ``dst[i]`` of the KV cache becomes a copy of row ``src[i]`` (as it was before any of
        the copies): the beams of one request taking the KV of the beams they continue. ``mask``,
        ``pos`` and ``pending`` are the caller's (a request's beams share their mask and position)."""
        device = self.mask.device
        source = torch.tensor(list(src), dtype=torch.long, device=device)
        target = torch.tensor(list(dst), dtype=torch.long, device=device)
        for layer in self.layers:
            layer.move_rows(source, target)

    def kv_bytes(self) -> tuple[int, int]:
        """(bytes holding real tokens, bytes allocated to the rows in use) over every slab layer;
        padding columns and each slab's spare columns count as allocated but unused."""
        allocated = used = 0
        real = int(self.mask.sum())
        for layer in self.cache.layers:
            k = getattr(layer, "_k", None)
            if k is None or not isinstance(layer, SlabLayer):
                continue
            size = layer.allocated_bytes()
            slots = self.mask.shape[0] * k.shape[2]  # rows x column capacity
            allocated += size
            used += size * real // slots if slots else 0
        return used, allocated

    def keep_new(self, kept: Sequence[int], written: int) -> None:
        """After a forward that wrote ``written`` columns to every row (speculative verification), keep
        row ``i``'s first ``kept[i]`` of them: the columns no row keeps are dropped, each row that keeps
        fewer than the most moves right by the difference (KV and mask), then common left padding goes."""
        top = max(kept)
        for layer in self.layers:
            layer.drop_last(written - top)
        width = self.width - (written - top)
        mask = self.mask[:, :width].clone()
        for i, count in enumerate(kept):
            shift = top - count
            if shift:
                for layer in self.layers:
                    layer.shift_row(i, shift)
                mask[i, shift:] = mask[i, : width - shift].clone()
                mask[i, :shift] = 0
        self.mask = mask
        self.trim_left()

    def grow_mask(self) -> None:
        """Append one real column to the mask (before a decode forward)."""
        ones = torch.ones((self.mask.shape[0], 1), dtype=self.mask.dtype, device=self.mask.device)
        self.mask = torch.cat([self.mask, ones], dim=1)

    def merge(self, other: KVBatch) -> None:
        """Append ``other``'s rows, left-padding the narrower side with zeros (masked out); only
        ``other``'s rows are copied unless a slab has to grow."""
        width = max(self.width, other.width)
        for a, b in zip(self.layers, other.layers, strict=True):
            a.append_rows(*b.views())
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
        picked = logits.gather(1, new_tokens[:, t : t + 1]).squeeze(1).float()
        columns.append(picked - log_normalizer(logits))
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
