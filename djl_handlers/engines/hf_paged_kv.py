"""The KV store of the packed step (:mod:`djl_handlers.engines.hf_packed`): one slot per request.

Per layer, keys and values live in a slab ``[slots, kv_heads, capacity, head_dim]``; a request
owns one slot for its whole life and its token ``t`` sits at column ``t`` (no padding, no
alignment between rows). Joining writes into a free slot and leaving only returns the slot to the
free list: **no copy of anybody's KV when rows join or leave** (the padded path re-packs the whole
batch at every change of membership). The slab is reallocated (one copy) only when it needs more
slots or more columns, in ``GROW`` steps, and freed when the last request leaves.

Why a slab and not pages (vLLM's block tables): on CPU, attention over pages needs either a paged
attention kernel (none in torch for CPU) or a gather of every row's pages into a contiguous tensor
at every layer and step, which costs more than the padding it saves. With slots the decode
attention of all rows is one SDPA call over the view ``[:span, :, :longest]`` with a length mask;
the price is memory: slots × the longest row's length, as in the padded path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

GROW = 128  # columns added when a row outgrows the slab (one copy per GROW tokens of the longest row)
SLOT_GROW = 8  # first slot block; the slot count doubles when more requests run


@dataclass
class SlotKV:
    """Slots ``[slots, kv_heads, capacity, head_dim]`` per layer, plus each slot's length."""

    layers: int
    max_len: int
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    free: list[int] = field(default_factory=list)
    used: set[int] = field(default_factory=set)

    n_slots: int = 0  # slots handed out so far (the slabs have this many rows once allocated)

    @property
    def capacity(self) -> int:
        """Columns allocated per slot."""
        return int(self.keys[0].shape[2]) if self.keys else 0

    @property
    def span(self) -> int:
        """1 + the highest slot in use (decode attention runs over slots ``[0, span)``)."""
        return max(self.used) + 1 if self.used else 0

    def acquire(self) -> int:
        """A free slot (the lowest, to keep the used slots dense)."""
        if not self.free:
            extra = max(SLOT_GROW, self.n_slots)  # doubling: few reallocations while a batch fills up
            self.free = list(range(self.n_slots, self.n_slots + extra))
            self.n_slots += extra
            if self.keys:
                self._reallocate(self.n_slots, self.capacity)
        slot = min(self.free)
        self.free.remove(slot)
        self.used.add(slot)
        return slot

    def release(self, slot: int) -> None:
        """Give ``slot`` back; with no slot in use, free the memory."""
        if slot not in self.used:
            return
        self.used.discard(slot)
        self.free.append(slot)
        if not self.used:
            self.keys, self.values, self.free, self.n_slots = [], [], [], 0

    def reserve(self, length: int, like: torch.Tensor) -> None:
        """Make every slot hold ``length`` columns; ``like`` (a key tensor [.., kv_heads, n, head_dim])
        gives dtype, device and shape on the first call."""
        if not self.keys:
            self._allocate(self.n_slots, _round(length), like)
        elif length > self.capacity:
            self._reallocate(self.n_slots, _round(length))

    def flat_index(self, slots: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Row indices into a slab viewed as ``[slots * kv_heads * capacity, head_dim]`` of token ``i``'s
        head ``h`` at ``(slots[i], cols[i])``, ordered token-major ([n * kv_heads])."""
        heads, cap = int(self.keys[0].shape[1]), self.capacity
        base = slots * (heads * cap) + cols
        return (base.unsqueeze(1) + torch.arange(heads, device=slots.device) * cap).reshape(-1)

    def write(self, layer: int, index: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store keys/values ``k``/``v`` ([n, kv_heads, head_dim]) at ``index`` (see :meth:`flat_index`)."""
        for store, src in ((self.keys, k), (self.values, v)):
            slab = store[layer]
            slab.view(-1, slab.shape[-1]).index_copy_(0, index, src.reshape(-1, src.shape[-1]))

    def nbytes(self) -> int:
        """Bytes held by the slabs."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def _allocate(self, slots: int, capacity: int, like: torch.Tensor) -> None:
        heads, dim = like.shape[-3], like.shape[-1]
        shape = (slots, heads, min(capacity, self.max_len), dim)
        self.keys = [like.new_zeros(shape) for _ in range(self.layers)]
        self.values = [like.new_zeros(shape) for _ in range(self.layers)]

    def _reallocate(self, slots: int, capacity: int) -> None:
        """Grow to ``slots`` x ``capacity``: copy the old block, zero only the new columns and slots
        (unused cells must be finite: a masked score is still computed before it is dropped)."""
        capacity = min(capacity, self.max_len)
        old_slots, old_cap = int(self.keys[0].shape[0]), self.capacity
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_empty((slots, old.shape[1], capacity, old.shape[3]))
                new[:old_slots, :, :old_cap] = old
                new[:old_slots, :, old_cap:].zero_()
                new[old_slots:].zero_()
                store[i] = new


def _round(n: int) -> int:
    return (n + GROW - 1) // GROW * GROW + GROW
