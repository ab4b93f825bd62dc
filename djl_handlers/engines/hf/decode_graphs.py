"""Static-shape decode steps of the HF engine (``option.decode_graphs``): the running batch's decode
forward on bucketed shapes, run eagerly, replayed as a CUDA graph, or through ``torch.compile``.

The running batch (:class:`~djl_handlers.engines.hf.batch.KVBatch`) changes shape every step: its
KV slab grows by one column, rows join and leave. A CUDA graph replays fixed shapes at fixed
addresses, so a step here runs on a **mirror** of the slab with bucketed shapes:

- rows padded up to a capture size (``option.cudagraph_capture_sizes``; vLLM's default sizes
  1, 2, 4, then every multiple of 8 up to the batch limit), columns up to a power of two (at least
  :data:`MIN_WIDTH`);
- one mirror K/V buffer per layer, shared by every bucket (a view of its first rows and columns),
  zeroed when allocated and grown (all graphs dropped) when a larger bucket is needed;
- the row's ``T`` cached columns sit at ``[0, T)``, the step writes column ``T`` (an index held in a
  device tensor, so a replay writes where the step says); the boolean mask lets a real row see its
  own real columns and its new one only, and a padding row only its new column: padded rows and
  columns never reach a real row's output (their stale values are finite and weigh exactly 0);
- after the forward the new column is written back into the slab (``SlabLayer.update``, as the
  dynamic step writes it), so the slab stays the one truth: joins, leaves, forks and prefix caching
  work on it unchanged. The mirror is copied in again only when the slab changed otherwise (other
  rows, another slab, trimmed padding): it records the slab view it mirrors and checks it each step.

Modes: ``static`` runs the bucketed forward eagerly (any device; how the CPU tests it), ``cuda_graphs``
captures one graph per (rows, columns) bucket at its first use and replays it, ``compile`` wraps the
bucketed forward in ``torch.compile`` (``mode="reduce-overhead"`` on CUDA, which replays graphs
itself). A step that does not fit (more rows than the largest capture size, a slab that is not the
engine's) takes the dynamic forward, and a failed capture turns the mode off for good; each such
reason is logged once.
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


def width_bucket(columns: int) -> int:
    """The column bucket for ``columns`` (cached tokens plus the new one): the next power of two,
    at least :data:`MIN_WIDTH`."""
    width = MIN_WIDTH
    while width < columns:
        width *= 2
    return width


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
        keys.index_copy_(2, self.column, key_states)
        values.index_copy_(2, self.column, value_states)
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
    run: Callable[[], torch.Tensor] | None = None  # the forward as this mode runs it
    graph: Any = None  # cuda_graphs: the captured graph
    logits: torch.Tensor | None = None  # cuda_graphs: the graph's output
    uses: int = 0


@dataclass
class _Mirrored:
    """What the mirror holds: the rows (in order) and the slab view of the first layer it copied."""

    rows: list[Any]
    view: torch.Tensor
    shape: tuple[int, ...] = field(default=())
    offset: int = -1


class DecodeGraphs:
    """The engine's static-shape decode step (see the module docstring).

    ``forward(ids, mask, pos, cache)`` is the engine's own forward (last-position logits [rows,
    vocab], float32); ``mode`` is ``static``, ``cuda_graphs`` or ``compile``."""

    def __init__(self, model: Any, forward: Callable[..., torch.Tensor], mode: str, sizes: Sequence[int]) -> None:
        if mode not in ("static", "cuda_graphs", "compile"):
            raise ValueError(f"decode graphs mode {mode!r}")
        self.model = model
        self.forward = forward
        self.mode = mode
        self.sizes = tuple(sorted(sizes))
        self.disabled: str | None = None  # why the mode was turned off for good
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._mirrored: _Mirrored | None = None
        self._logged: set[str] = set()
        self._pool: Any = None
        self.stats = {"static_steps": 0, "eager_steps": 0, "captures": 0, "mirror_loads": 0}

    # ------------------------------------------------------------------ the step
    def decode(self, batch: KVBatch) -> torch.Tensor | None:
        """The decode forward of ``batch`` (its mask already grown by the new column) on bucketed
        shapes; writes the new column into the slab and returns the logits [rows, vocab]. None:
        this step does not fit (reason logged once): the caller runs the dynamic forward."""
        reason = self._misfit(batch)
        if reason is not None:
            self._note(reason)
            self.stats["eager_steps"] += 1
            return None
        rows, cached = len(batch.rows), batch.width - 1
        size = next(s for s in self.sizes if s >= rows)
        layers = batch.layers
        first = layers[0].views()[0]
        self._ensure_mirror(len(layers), size, width_bucket(cached + 1), first, layers[0].views()[1])
        bucket = self._bucket(size, width_bucket(cached + 1))
        if not self._holds(batch):
            for layer, k, v in zip(layers, self._k, self._v, strict=True):
                keys, values = layer.views()
                k[:rows, :, :cached].copy_(keys)
                v[:rows, :, :cached].copy_(values)
            self.stats["mirror_loads"] += 1
        self._fill(bucket, batch, rows, cached)
        try:
            logits = self._run(bucket)
        except Exception as exc:  # noqa: BLE001 - a capture or compile that fails turns the mode off
            self.disabled = f"{self.mode} failed ({type(exc).__name__}: {exc}); decode steps run without it"
            LOG.warning("decode graphs: %s", self.disabled, exc_info=True)
            self._release()
            self.stats["eager_steps"] += 1
            return None
        for layer, k, v in zip(layers, self._k, self._v, strict=True):
            layer.update(k[:rows, :, cached : cached + 1], v[:rows, :, cached : cached + 1])
        self._remember(batch)
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

    def _note(self, reason: str) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            LOG.info("decode graphs: a step runs without them: %s", reason)

    # ------------------------------------------------------------------ the mirror
    def _ensure_mirror(self, layers: int, rows: int, width: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Mirror buffers of at least ``rows`` x ``width`` (zeros; grown ones drop every bucket)."""
        if self._k and self._k[0].shape[0] >= rows and self._k[0].shape[2] >= width:
            return
        if self._k:
            rows, width = max(rows, self._k[0].shape[0]), max(width, self._k[0].shape[2])
        self._release()
        _, heads, _, dim = keys.shape
        self._k = [keys.new_zeros((rows, heads, width, dim)) for _ in range(layers)]
        self._v = [values.new_zeros((rows, heads, width, values.shape[-1])) for _ in range(layers)]

    def _release(self) -> None:
        """Drop every bucket (graphs, compiled code) and the mirror's contents."""
        self._buckets.clear()
        self._mirrored = None
        self._k, self._v = [], []

    def _holds(self, batch: KVBatch) -> bool:
        """Whether the mirror already holds ``batch``'s KV (same rows, same slab view as recorded)."""
        held = self._mirrored
        if held is None or len(held.rows) != len(batch.rows):
            return False
        if any(a is not b for a, b in zip(held.rows, batch.rows, strict=True)):
            return False
        view = batch.layers[0].views()[0]
        return (view.untyped_storage().data_ptr() == held.view.untyped_storage().data_ptr()
                and tuple(view.shape) == held.shape and view.storage_offset() == held.offset)

    def _remember(self, batch: KVBatch) -> None:
        view = batch.layers[0].views()[0]
        self._mirrored = _Mirrored(list(batch.rows), view, tuple(view.shape), int(view.storage_offset()))

    # ------------------------------------------------------------------ buckets
    def _bucket(self, rows: int, width: int) -> _Bucket:
        found = self._buckets.get((rows, width))
        if found is not None:
            return found
        device = self._k[0].device
        column = torch.zeros(1, dtype=torch.long, device=device)
        cache = DynamicCache(config=self.model.config)
        cache.layers = [_MirrorLayer(k[:rows, :, :width], v[:rows, :, :width], column)
                        for k, v in zip(self._k, self._v, strict=True)]
        bucket = _Bucket(rows, width, ids=torch.zeros((rows, 1), dtype=torch.long, device=device),
                         pos=torch.zeros((rows, 1), dtype=torch.long, device=device),
                         mask=torch.zeros((rows, 1, 1, width), dtype=torch.bool, device=device),
                         column=column, cache=cache)
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
        bucket.column.fill_(cached)

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
                self._eager(bucket)
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA call (a metrics read) does not break this capture
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            bucket.logits = self._eager(bucket)
        bucket.graph = graph
        self.stats["captures"] += 1
        LOG.info("decode graphs: captured rows=%d columns=%d", bucket.rows, bucket.width)
