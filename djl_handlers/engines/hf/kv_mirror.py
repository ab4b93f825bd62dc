"""The decode graphs' KV mirror (:mod:`djl_handlers.engines.hf.decode_graphs`): per-layer key/value
buffers on bucketed shapes beside the running batch's slab, what they hold, and their bytes.

Each layer's buffers (``[rows, kv_heads, width, head_dim]``) sit beside that layer's slab: its
device, dtype and head shape. A row's cached columns are copied to ``[0, T)``; the step writes
column ``T`` and the new column is written back into the slab, which stays the one truth. The
mirror records which slab view it copied (the rows in order, the first layer's storage, shape and
offset) by weak references, so a finished batch's slab and rows are freed with the batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from djl_handlers.engines.hf.batch import KVBatch
from djl_handlers.engines.hf.slab_ledger import SlabLedger

__all__ = ["KVMirror", "cell_bytes"]


def cell_bytes(layers: Sequence[Any]) -> int:
    """Bytes one (row, column) cell takes over every layer's keys and values (as in the slab)."""
    total = 0
    for layer in layers:
        for t in layer.views():
            total += t.shape[1] * t.shape[3] * t.element_size()
    return total


@dataclass
class _Held:
    """The slab view last copied in: its rows (in order) and the first layer's storage, shape, offset."""

    rows: list[weakref.ref[Any]]
    storage: weakref.ref[Any]
    shape: tuple[int, ...]
    offset: int


class KVMirror:
    """Per-layer K/V buffers beside the slab (see the module docstring); empty until allocated."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._held: _Held | None = None
        self.ledger: SlabLedger | None = None  # the engine's KV ledger: told the mirror's bytes, asked for room

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, width) of the buffers; (0, 0) when none is allocated."""
        return (int(self.keys[0].shape[0]), int(self.keys[0].shape[2])) if self.keys else (0, 0)

    def nbytes(self) -> int:
        """Bytes the buffers hold (0 when none is allocated)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def matches(self, layers: Sequence[Any]) -> bool:
        """Whether there is one buffer pair per slab layer with its device, dtype, heads and head size."""
        if not self.keys or len(self.keys) != len(layers):
            return False
        for layer, k, v in zip(layers, self.keys, self.values, strict=True):
            for mirror, slab in zip((k, v), layer.views(), strict=True):
                if (mirror.device != slab.device or mirror.dtype != slab.dtype
                        or mirror.shape[1] != slab.shape[1] or mirror.shape[3] != slab.shape[3]):
                    return False
        return True

    def covers(self, layers: Sequence[Any], rows: int, width: int) -> bool:
        """Whether the buffers match ``layers`` and hold at least ``rows`` x ``width``."""
        have_rows, have_width = self.shape
        return have_rows >= rows and have_width >= width and self.matches(layers)

    def allocate(self, layers: Sequence[Any], rows: int, width: int) -> bool:
        """New zeroed buffers of ``rows`` x ``width`` beside each of ``layers`` (the old ones dropped first);
        False, and none allocated, when they do not fit beside the slabs' capacity within the ledger's
        bound even after the slabs gave their spare room back."""
        self.clear()
        if self.ledger is not None and not self.ledger.make_room(rows * width * cell_bytes(layers)):
            return False
        for layer in layers:
            keys, values = layer.views()
            self.keys.append(keys.new_zeros((rows, keys.shape[1], width, keys.shape[3])))
            self.values.append(values.new_zeros((rows, values.shape[1], width, values.shape[3])))
        self._tell()
        return True

    def clear(self) -> None:
        """Drop the buffers and the record."""
        self.keys, self.values = [], []
        self._held = None
        self._tell()

    def _tell(self) -> None:
        if self.ledger is not None:
            self.ledger.mirror_bytes = self.nbytes()

    def holds(self, batch: KVBatch) -> bool:
        """Whether the buffers already hold ``batch``'s KV (same rows, same slab view as recorded)."""
        held = self._held
        if held is None or len(held.rows) != len(batch.rows):
            return False
        if any(ref() is not row for ref, row in zip(held.rows, batch.rows, strict=True)):
            return False
        view = batch.layers[0].views()[0]
        # torch keeps one Python object per live storage: the same object is the same slab
        return (held.storage() is view.untyped_storage()
                and tuple(view.shape) == held.shape and view.storage_offset() == held.offset)

    def load(self, batch: KVBatch) -> None:
        """Copy ``batch``'s cached columns (all but the new one its mask has grown) into ``[0, T)``."""
        rows, cached = len(batch.rows), batch.width - 1
        for layer, k, v in zip(batch.layers, self.keys, self.values, strict=True):
            keys, values = layer.views()
            k[:rows, :, :cached].copy_(keys)
            v[:rows, :, :cached].copy_(values)

    def write_back(self, batch: KVBatch) -> None:
        """Append the column the step wrote at ``T`` to ``batch``'s slab, and record the slab view."""
        rows, cached = len(batch.rows), batch.width - 1
        for layer, k, v in zip(batch.layers, self.keys, self.values, strict=True):
            layer.update(k[:rows, :, cached : cached + 1], v[:rows, :, cached : cached + 1])
        view = batch.layers[0].views()[0]
        self._held = _Held([weakref.ref(row) for row in batch.rows], weakref.ref(view.untyped_storage()),
                           tuple(view.shape), int(view.storage_offset()))
