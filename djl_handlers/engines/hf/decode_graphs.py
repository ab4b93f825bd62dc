"""Static-shape decode steps of the HF engine (``option.decode_graphs``): the running batch's decode
forward on bucketed shapes, run eagerly, replayed as a CUDA graph, or through ``torch.compile``.

The running batch (:class:`~djl_handlers.engines.hf.batch.KVBatch`) changes shape every step: its
KV slab grows by one column, rows join and leave. A CUDA graph replays fixed shapes at fixed
addresses, so a step here runs on a **mirror** of the slab with bucketed shapes:

- rows padded up to a capture size (``option.cudagraph_capture_sizes``; vLLM's default sizes
  1, 2, 4, then every multiple of 8 up to the batch limit), columns up to a power of two (at least
  :data:`MIN_WIDTH`, at most the model's context length);
- one mirror K/V buffer per layer (:mod:`djl_handlers.engines.hf.kv_mirror`), beside that layer's
  slab (its device, dtype and head shape), shared by every bucket (a view of its first rows and
  columns), zeroed when allocated and grown (all graphs dropped) when a larger bucket is needed;
- the row's ``T`` cached columns sit at ``[0, T)``, the step writes column ``T`` (an index held in a
  device tensor, so a replay writes where the step says); the boolean mask lets a real row see its
  own real columns and its new one only, and a padding row only its new column: padded rows and
  columns never reach a real row's output (their stale values are finite and weigh exactly 0);
- after the forward the new column is written back into the slab (``SlabLayer.update``, as the
  dynamic step writes it), so the slab stays the one truth: joins, leaves, forks and prefix caching
  work on it unchanged. The mirror is copied in again only when the slab changed otherwise (other
  rows, another slab, trimmed padding): it records which slab view it mirrors (weakly: a finished
  batch's slab and rows are freed with the batch, not kept until the next step) and checks it each step.

The mirror is a second copy of the running batch's KV, so under ``option.kv_cache_memory_bytes`` it
is charged against the same bound: a step gets the room the bound leaves beside the running rows'
reserved cache (``room``), a mirror that would not fit there is not allocated and the step takes the
dynamic forward (counted in ``stats["over_bound_steps"]``), and the engine counts
:meth:`DecodeGraphs.mirror_bytes` at admission. The mirror stays allocated while the batch is empty,
so its graphs serve the next batch; under a bound, one larger than the running rows' next step needs
(:meth:`DecodeGraphs.need_bytes`) gives way to a request it keeps out (:meth:`DecodeGraphs.yield_room`).

Modes: ``static`` runs the bucketed forward eagerly (any device; how the CPU tests it), ``cuda_graphs``
captures one graph per (rows, columns) bucket at its first use and replays it (the graphs share one
memory pool and write their logits into one buffer outside it, so no bucket keeps memory of its own
in the pool between replays), ``compile`` wraps the bucketed forward in ``torch.compile``
(``mode="reduce-overhead"`` on CUDA, which replays graphs itself; the buffers the step reads and
writes in place are marked static, as graph trees skip graphs for a function that mutates its other
inputs). A step that does not fit (more rows than the largest
capture size, a slab that is not the engine's, a mirror over the bound) takes the dynamic forward, and
a failed capture turns the mode off for good; each such reason is logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from djl_handlers.engines.hf.batch import KVBatch
from djl_handlers.engines.hf.kv_mirror import KVMirror, cell_bytes

__all__ = ["MIN_WIDTH", "MODES", "DecodeGraphs", "capture_sizes", "resolve_mode", "width_bucket"]

LOG = logging.getLogger(__name__)

MODES: tuple[str, ...] = ("auto", "cuda_graphs", "compile", "static", "off")
MIN_WIDTH = 64  # the narrowest column bucket


def capture_sizes(max_rows: int, sizes: Sequence[int] | None = None) -> tuple[int, ...]:
    """Row buckets up to ``max_rows``: ``sizes`` when given (sorted, those above ``max_rows``
    dropped), else vLLM's default pattern 1, 2, 4, 8, 16, 24, ...; ``max_rows`` itself is always one."""
    if sizes:
        chosen = {s for s in sizes if 0 < s <= max_rows}
    else:
        chosen = {s for s in (1, 2, 4) if s <= max_rows} | set(range(8, max_rows + 1, 8))
    return tuple(sorted(chosen | {max_rows}))


def width_bucket(columns: int, most: int | None = None) -> int:
    """The column bucket for ``columns`` (cached tokens plus the new one): the next power of two,
    at least :data:`MIN_WIDTH`, and at most ``most`` (the model's context length: no row is wider)."""
    width = MIN_WIDTH
    while width < columns:
        width *= 2
    return width if most is None else max(columns, min(width, most))


def resolve_mode(mode: str, device: torch.device, enforce_eager: bool = False) -> str:
    """The mode a model on ``device`` runs: ``off`` with ``enforce_eager``; ``auto`` is ``off`` on
    every device until graph replay has been checked on a GPU (on the CPU the bucketed step is slower
    than the dynamic one); ``cuda_graphs`` needs CUDA."""
    if enforce_eager or mode in ("off", "auto"):
        return "off"
    if mode == "cuda_graphs" and device.type != "cuda":
        LOG.warning("option.decode_graphs=cuda_graphs needs a CUDA device (the model is on %s): decode "
                    "steps run without graphs", device)
        return "off"
    return mode


class _MirrorLayer(DynamicLayer):
    """A cache layer over fixed mirror views: ``update`` writes the new column at ``column``
    (a device tensor) in place and returns the whole views."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.column = keys, values, column
        self.is_initialized = True
        self.device = keys.device

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys, self.values
        assert keys is not None and values is not None
        # a 16-bit KV cache under fp32 weights (option.kv_cache_dtype): stored in the mirror's dtype
        keys.index_copy_(2, self.column, key_states.to(keys.dtype))
        values.index_copy_(2, self.column, value_states.to(values.dtype))
        return keys, values


@dataclass
class _Bucket:
    """One (rows, columns) bucket: its input buffers, its cache of mirror views, its runner."""

    rows: int
    width: int
    ids: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor
    column: torch.Tensor
    cache: Any
    columns: list[torch.Tensor] = field(default_factory=list)  # ``column`` on each device of the layers
    run: Callable[[], torch.Tensor] | None = None  # the forward as this mode runs it
    graph: Any = None  # cuda_graphs: the captured graph
    logits: torch.Tensor | None = None  # cuda_graphs: the graph's output
    uses: int = 0


class DecodeGraphs:
    """The engine's static-shape decode step (see the module docstring).

    ``forward(ids, mask, pos, cache)`` is the engine's own forward (last-position logits [rows,
    vocab], float32); ``mode`` is ``static``, ``cuda_graphs`` or ``compile``."""

    def __init__(self, model: Any, forward: Callable[..., torch.Tensor], mode: str, sizes: Sequence[int],
                 max_width: int | None = None) -> None:
        if mode not in ("static", "cuda_graphs", "compile"):
            raise ValueError(f"decode graphs mode {mode!r}")
        self.model = model
        self.max_width = max_width  # the widest column bucket (the engine's max_model_len)
        self.forward = forward
        self.mode = mode
        self.sizes = tuple(sorted(sizes))
        self.disabled: str | None = None  # why the mode was turned off for good
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self.mirror = KVMirror()  # the K/V buffers every bucket views (engines/hf/kv_mirror.py)
        self._logged: set[str] = set()
        self._pool: Any = None
        self._out: torch.Tensor | None = None  # cuda_graphs: the logits every graph writes (rows, vocab)
        self.stats = {"static_steps": 0, "eager_steps": 0, "captures": 0, "mirror_loads": 0,
                      "mirror_allocations": 0, "over_bound_steps": 0, "mirror_yields": 0}

    # ------------------------------------------------------------------ the step
    def decode(self, batch: KVBatch, room: int | None = None) -> torch.Tensor | None:
        """The decode forward of ``batch`` (its mask already grown by the new column) on bucketed
        shapes; writes the new column into the slab and returns the logits [rows, vocab]. ``room``:
        the bytes the mirror may take (None: no bound). None: this step does not fit (reason logged
        once): the caller runs the dynamic forward."""
        reason = self._misfit(batch)
        if reason is None:
            reason = self._ensure_mirror(batch.layers, self._size(len(batch.rows)), self._width(batch.width), room)
            if reason is not None:
                self.stats["over_bound_steps"] += 1
        if reason is not None:
            self._note(reason)
            self.stats["eager_steps"] += 1
            return None
        rows, cached = len(batch.rows), batch.width - 1
        bucket = self._bucket(self._size(rows), self._width(cached + 1))
        if not self.mirror.holds(batch):
            self.mirror.load(batch)
            self.stats["mirror_loads"] += 1
        self._fill(bucket, batch, rows, cached)
        try:
            logits = self._run(bucket)
        except Exception as exc:  # noqa: BLE001 - a capture or compile that fails turns the mode off
            self.disabled = f"{self.mode} failed ({type(exc).__name__}: {exc}); decode steps run without it"
            LOG.warning("decode graphs: %s", self.disabled, exc_info=True)
            self.release()
            self.stats["eager_steps"] += 1
            return None
        self.mirror.write_back(batch)
        self.stats["static_steps"] += 1
        return logits[:rows].clone()

    def _misfit(self, batch: KVBatch) -> str | None:
        """Why ``batch``'s step cannot take the static path, or None."""
        if self.disabled is not None:
            return self.disabled
        if len(batch.rows) > self.sizes[-1]:
            return f"more rows ({len(batch.rows)}) than the largest capture size ({self.sizes[-1]})"
        layer = batch.layers[0]
        if not hasattr(layer, "views") or layer.keys is None or layer.keys.shape[2] != batch.width - 1:
            return "the KV cache is not the engine's slab"
        return None

    def _size(self, rows: int) -> int:
        """The row bucket of ``rows`` (at most the largest capture size)."""
        return next(s for s in self.sizes if s >= rows)

    def _width(self, columns: int) -> int:
        """The column bucket of ``columns``."""
        return width_bucket(columns, self.max_width)

    def _note(self, reason: str) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            LOG.info("decode graphs: a step runs without them: %s", reason)

    # ------------------------------------------------------------------ the mirror
    def mirror_bytes(self) -> int:
        """Bytes the mirror's K/V buffers hold (0 when none is allocated)."""
        return self.mirror.nbytes()

    def need_bytes(self, batch: KVBatch | None) -> int:
        """Bytes of the mirror ``batch``'s next decode step needs (0: no batch, or its step would not
        take the static path)."""
        if batch is None or not batch.rows or self.disabled is not None or len(batch.rows) > self.sizes[-1]:
            return 0
        return self._size(len(batch.rows)) * self._width(batch.width + 1) * cell_bytes(batch.layers)

    def yield_room(self) -> None:
        """Release the mirror for a request waiting for its room (counted in ``stats``)."""
        self.stats["mirror_yields"] += 1
        self.release()

    def release(self) -> None:
        """Drop every bucket (graphs, compiled code), the mirror's buffers and the graphs' output."""
        self._buckets.clear()
        self._out = None
        self.mirror.clear()

    def _ensure_mirror(self, layers: Sequence[Any], rows: int, width: int, room: int | None) -> str | None:
        """Mirror buffers of at least ``rows`` x ``width`` (a new one drops every bucket): the current
        one when it covers them, else one covering both it and them when that fits ``room`` bytes,
        else exactly ``rows`` x ``width``. None, or why no mirror fits."""
        mirror = self.mirror
        if mirror.covers(layers, rows, width):
            return None
        cell = cell_bytes(layers)
        if mirror.matches(layers):
            grown = (max(rows, mirror.shape[0]), max(width, mirror.shape[1]))
            if room is None or grown[0] * grown[1] * cell <= room:
                rows, width = grown
        self.release()  # before allocating: the old and the new mirror never coexist
        if room is not None and rows * width * cell > room:
            return "the mirror does not fit beside the running rows' KV within option.kv_cache_memory_bytes"
        if not mirror.allocate(layers, rows, width):
            return "the mirror does not fit beside the KV slabs' capacity within option.kv_cache_memory_bytes"
        self.stats["mirror_allocations"] += 1
        return None

    # ------------------------------------------------------------------ buckets
    def _bucket(self, rows: int, width: int) -> _Bucket:
        found = self._buckets.get((rows, width))
        if found is not None:
            return found
        keys, values = self.mirror.keys, self.mirror.values
        device = keys[0].device
        # the new column's index, one per device the layers live on (a model split by device_map)
        columns = {k.device: torch.zeros(1, dtype=torch.long, device=k.device) for k in keys}
        layers = [_MirrorLayer(k[:rows, :, :width], v[:rows, :, :width], columns[k.device])
                  for k, v in zip(keys, values, strict=True)]
        cache = DynamicCache(config=self.model.config)
        cache.layers = list(layers)
        bucket = _Bucket(rows, width, ids=torch.zeros((rows, 1), dtype=torch.long, device=device),
                         pos=torch.zeros((rows, 1), dtype=torch.long, device=device),
                         mask=torch.zeros((rows, 1, 1, width), dtype=torch.bool, device=device),
                         column=columns[device], cache=cache, columns=list(columns.values()))
        if self.mode == "compile":
            # fixed addresses, written in place between calls: without this mark, CUDA graph trees
            # (``reduce-overhead``) skip graphs for a compiled step that mutates its inputs (the mirror)
            for tensor in (bucket.ids, bucket.pos, bucket.mask, *bucket.columns,
                           *(t for layer in layers for t in (layer.keys, layer.values))):
                torch._dynamo.mark_static_address(tensor)
        self._buckets[(rows, width)] = bucket
        return bucket

    def _fill(self, bucket: _Bucket, batch: KVBatch, rows: int, cached: int) -> None:
        """Copy this step's inputs into ``bucket``'s buffers (padding rows: token 0 at position 0,
        seeing only their own new column)."""
        bucket.ids[:rows, 0].copy_(batch.pending)
        bucket.ids[rows:].zero_()
        bucket.pos[:rows, 0].copy_(batch.pos)
        bucket.pos[rows:].zero_()
        mask = bucket.mask
        mask.zero_()
        mask[:rows, 0, 0, : cached + 1].copy_(batch.mask.bool())
        mask[rows:, 0, 0, cached] = True
        for column in bucket.columns:
            column.fill_(cached)

    def _eager(self, bucket: _Bucket) -> torch.Tensor:
        return self.forward(bucket.ids, bucket.mask, bucket.pos, bucket.cache)

    def _run(self, bucket: _Bucket) -> torch.Tensor:
        bucket.uses += 1
        if self.mode == "static":
            return self._eager(bucket)
        if self.mode == "compile":
            if bucket.run is None:
                compile_mode = "reduce-overhead" if bucket.ids.device.type == "cuda" else "default"
                compiled = torch.compile(self._eager, mode=compile_mode, dynamic=False)
                bucket.run = lambda: compiled(bucket)
            return bucket.run()
        if bucket.graph is None:
            self._capture(bucket)
        bucket.graph.replay()
        assert bucket.logits is not None
        return bucket.logits

    def _capture(self, bucket: _Bucket) -> None:
        """Capture ``bucket``'s forward as a CUDA graph (after warm-up runs on a side stream; they
        write the same new column the replay writes)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                warm = self._eager(bucket)
        torch.cuda.current_stream().wait_stream(stream)
        if self._out is None:
            # every graph writes its logits into this one buffer, outside the graphs' pool: a graph's
            # own output would stay allocated in the pool for as long as the graph, one per bucket
            self._out = warm.new_empty((self.sizes[-1], warm.shape[1]))
        out = self._out[: bucket.rows]
        if out.shape != warm.shape or out.dtype != warm.dtype:
            raise RuntimeError(f"logits {tuple(warm.shape)} {warm.dtype} do not fit the graphs' output buffer")
        del warm
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA call (a metrics read) does not break this capture
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out.copy_(self._eager(bucket))
        bucket.logits = out
        bucket.graph = graph
        self.stats["captures"] += 1
        LOG.info("decode graphs: captured rows=%d columns=%d", bucket.rows, bucket.width)

