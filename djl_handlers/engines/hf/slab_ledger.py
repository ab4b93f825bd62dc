"""The HF engine's KV allocation ledger under ``option.kv_cache_memory_bytes``: the capacity every live
slab holds (spare rows and columns included) beside the decode graphs' mirror, the room a growing
slab may take, and the spare room other slabs give back when a slab or the mirror needs it.

Admission (:mod:`djl_handlers.engines.hf.kv_budget`) reserves the cells the rows will hold; the slabs
(:class:`~djl_handlers.engines.hf.batch.SlabLayer`) ask this ledger how much they may *allocate*, so
that on a device where every allocated byte is real (CUDA) the slabs' capacity plus the mirror stays
within the bound: a slab takes its spare room only from what the bound leaves, and when even its need
does not fit, the other slabs are compacted to their content first (their spare is what stands in the
way; admission guarantees the needs fit). A need that still does not fit is allocated anyway (a request
is never failed for it) and counted in :attr:`SlabLedger.over_bound`, which the tests hold at 0.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

__all__ = ["SlabGroup", "SlabLedger"]

LOG = logging.getLogger(__name__)


class SlabGroup:
    """The layers of one slab cache: they take the same shapes, so they decide their room together.
    Holds no reference to them (the layers hold it), so a cache is freed as soon as it is dropped."""

    def __init__(self, layers: int) -> None:
        self.layers = max(1, layers)


class SlabLedger:
    """The bound (``limit`` bytes, None: none), the mirror's bytes, and every live slab layer."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.mirror_bytes = 0  # the decode graphs' mirror (kept current by kv_mirror.KVMirror)
        self.over_bound = 0  # allocations whose need alone did not fit (admission should prevent them)
        self.compactions = 0  # times other slabs gave their spare room back
        self._layers: weakref.WeakSet[Any] = weakref.WeakSet()

    def register(self, layer: Any) -> None:
        """Count ``layer`` (a ``SlabLayer`` with ``group`` and ``capacity_bytes``) while it lives."""
        self._layers.add(layer)

    def capacity(self, exclude: SlabGroup | None = None) -> int:
        """Bytes the live slabs have allocated (spare included), except the layers of ``exclude``."""
        return sum(layer.capacity_bytes for layer in list(self._layers) if layer.group is not exclude)

    def room(self, group: SlabGroup | None) -> int | None:
        """Bytes the bound leaves for ``group``'s layers beside the other slabs and the mirror (None: no bound)."""
        if self.limit is None:
            return None
        return self.limit - self.mirror_bytes - self.capacity(group)

    def make_room(self, need: int, group: SlabGroup | None = None) -> bool:
        """Whether ``need`` bytes (for ``group``, or the mirror when None) fit; when they do not, the other
        slabs are compacted to their content first (a copy each)."""
        room = self.room(group)
        if room is None or room >= need:
            return True
        compacted = False
        for layer in list(self._layers):
            if layer.group is not group and layer.compact():
                compacted = True
        if compacted:
            self.compactions += 1
        room = self.room(group)
        return room is not None and room >= need

    def shape(self, group: SlabGroup, rows: tuple[int, int], left: tuple[int, int], width: int,
              right: tuple[int, int], cell: int) -> tuple[int, int, int]:
        """``(rows, left, right)`` for a slab of ``group`` to allocate around ``width`` columns, ``cell``
        bytes per row and column; ``rows``, ``left`` and ``right`` (spare columns on each side) are
        ``(need, want)`` pairs. Every want when there is no bound or when it fits the room the bound leaves
        the group; else the spare rows go first, then the spare columns on the left, then the spare
        columns on the right are cut to what fits. When even the needs do not fit, the other slabs give
        their spare back first (:meth:`make_room`); if they still do not, the needs are allocated and
        the overrun is counted."""
        if self.limit is None:
            return rows[1], left[1], right[1]
        per_cell = cell * group.layers  # every layer of the group takes this shape
        need = rows[0] * (left[0] + width + right[0]) * per_cell
        for attempt in range(2):
            room = self.room(group) or 0
            cells = room // per_cell if room > 0 else 0
            for r, lft in ((rows[1], left[1]), (rows[0], left[1])):
                if r * (lft + width + right[1]) <= cells:
                    return r, lft, right[1]
            more = min(right[1], cells // max(1, rows[0]) - left[0] - width)
            if more >= right[0]:
                return rows[0], left[0], more
            if attempt == 0 and not self.make_room(need, group):
                break
        self.overrun(need)
        return rows[0], left[0], right[0]

    def overrun(self, need: int) -> None:
        """Record an allocation of ``need`` bytes that the bound could not hold (logged once)."""
        self.over_bound += 1
        if self.over_bound == 1:
            LOG.warning("KV slab: an allocation of %d bytes exceeds option.kv_cache_memory_bytes (%s) beside the "
                        "other slabs and the mirror; admission should have kept it within", need, self.limit)
