"""Mixed-adapter LoRA for the HF (and DeepSpeed) engine: per-row adapters in one forward.

Every linear layer some loaded adapter targets gets one forward hook. Before each forward the
engine calls :meth:`LoraSet.use` with one entry per batch row (a :class:`LoraWeights` or None for
the base model); the hook then adds each row's ``(x @ A^T) @ (scale * B^T)`` to the layer's output.
Two strategies (``LoraSet.strategy``), measured in ``benchmarks/lora.py``:

* ``stacked`` (default): the ``k`` active adapters' factors side by side (``[in, sum r]`` and
  ``[sum r, out]``, built once per layer while the set of active adapters stays the same) and a
  per-row 0/1 mask over the ``sum r`` columns: two matmuls and one multiply per layer whatever ``k``
  (a row computes the other adapters' ``r`` columns too, and zeroes them);
* ``grouped``: per adapter, gather its rows, two matmuls, ``index_add`` back: ``4k`` ops per layer,
  nothing computed for rows of other adapters.

One adapter for the whole batch is two plain matmuls in both. Rows hold their ``LoraWeights``
object, so unloading an adapter never changes a request that is already running (the weights
live until its last row finishes).

Limits (LMI's options): ``max_lora_rank`` (checked at load), ``max_cpu_loras`` (adapters loaded at
once: loading one more is an ``AdapterLimit``), ``max_loras`` (distinct adapters in one running
batch: a request whose adapter would exceed it waits in the queue, see :meth:`LoraSet.admits`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import torch

from djl_handlers.engines.hf.lora_weights import LoraWeights, load_lora_weights
from djl_handlers.lora.registry import AdapterLimit, AdapterNotFound, AdapterSpec

LOG = logging.getLogger(__name__)

__all__ = ["LoraSet"]


class LoraSet:
    """The adapters loaded into one model, their hooks and the rows of the current forward."""

    def __init__(self, model: Any, max_loras: int = 4, max_lora_rank: int = 16,
                 max_cpu_loras: Optional[int] = None) -> None:
        self.model = model
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras or max_loras
        self.specs: dict[str, AdapterSpec] = {}
        self.loaded: dict[str, LoraWeights] = {}
        self._hooked: dict[str, Any] = {}
        self._groups: list[tuple[LoraWeights, Optional[torch.Tensor]]] = []
        self._rows = 0  # batch size the groups were set for
        self.strategy = "stacked"  # or "grouped" (see the module docstring; benchmarks/lora.py compares)
        self._active: list[LoraWeights] = []
        self._cat: dict[str, Optional[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._mask: Optional[torch.Tensor] = None

    # -- loading -----------------------------------------------------------------------------
    def load(self, spec: AdapterSpec) -> None:
        """Register ``spec`` and load its weights now (``preload``) or at first use; replaces a
        loaded adapter of the same name only when its source changed."""
        current = self.loaded.get(spec.name)
        self.specs[spec.name] = spec
        if not spec.preload:
            if current is not None and not spec.pin:
                del self.loaded[spec.name]  # preload=false: unload now, load again on first use
            return
        if current is None or current.src != spec.src:
            self._load(spec)

    def _load(self, spec: AdapterSpec) -> LoraWeights:
        weights = load_lora_weights(spec.name, spec.src, self.model, self.max_lora_rank)  # validates first
        if spec.name not in self.loaded and len(self.loaded) >= self.max_cpu_loras:
            raise AdapterLimit(
                f"cannot load adapter {spec.label!r}: {len(self.loaded)} adapters are loaded "
                f"({', '.join(sorted(self.loaded))}) and option.max_cpu_loras={self.max_cpu_loras}; "
                "unregister one or raise option.max_cpu_loras", field="option.max_cpu_loras")
        for module_name in weights.layers:
            if module_name not in self._hooked:
                module = self.model.get_submodule(module_name)
                self._hooked[module_name] = module.register_forward_hook(self._hook(module_name))
        self.loaded[spec.name] = weights
        LOG.info("LoRA adapter %s loaded: rank %d, %d layers, %.1f MB", spec.label, weights.rank,
                 len(weights.layers), weights.nbytes() / 1e6)
        return weights

    def unload(self, name: str) -> None:
        """Forget ``name``; rows already using it keep their weights until they finish."""
        self.specs.pop(name, None)
        self.loaded.pop(name, None)

    def resolve(self, name: str) -> LoraWeights:
        """The weights of registered adapter ``name`` (loaded now if it was registered lazily)."""
        weights = self.loaded.get(name)
        if weights is not None:
            return weights
        spec = self.specs.get(name)
        if spec is None:
            raise AdapterNotFound(f"adapter {name!r} is not registered", field="adapters")
        return self._load(spec)

    # -- batching ----------------------------------------------------------------------------
    def admits(self, active: Iterable[Optional[LoraWeights]], candidate: Optional[LoraWeights]) -> bool:
        """True when a row with ``candidate`` fits ``max_loras`` next to the ``active`` rows."""
        if candidate is None:
            return True
        distinct = {id(w) for w in active if w is not None}
        return id(candidate) in distinct or len(distinct) < self.max_loras

    def use(self, rows: Sequence[Optional[LoraWeights]]) -> None:
        """Set the adapters of the rows of the next forward (one entry per batch row)."""
        groups: dict[int, tuple[LoraWeights, list[int]]] = {}
        for index, weights in enumerate(rows):
            if weights is not None:
                groups.setdefault(id(weights), (weights, []))[1].append(index)
        device = next(iter(self.model.parameters())).device
        self._rows = len(rows)
        if self.strategy == "stacked":
            self._stack([w for w, _ in groups.values()], rows, device)
            self._groups = [(w, None) for w, _ in groups.values()]  # only "is any adapter active" is read
            return
        self._groups = [
            (weights, None if len(idx) == len(rows) else torch.tensor(idx, dtype=torch.long, device=device))
            for weights, idx in groups.values()
        ]

    def _stack(self, active: list[LoraWeights], rows: Sequence[Optional[LoraWeights]], device: Any) -> None:
        """``stacked``: the active adapters side by side (``A^T`` blocks concatenated, cached per layer
        while the set of active adapters stays the same) and a per-row mask selecting a row's block."""
        same = len(active) == len(self._active) and all(a is b for a, b in zip(active, self._active, strict=True))
        if not same:
            self._active, self._cat = active, {}
        if not active:
            self._mask = None
            return
        if len(active) == 1 and all(r is active[0] for r in rows):
            self._mask = None  # one adapter for every row: no mask needed
            return
        dtype = next(iter(self.model.parameters())).dtype
        offsets, width = {}, 0
        for weights in active:
            offsets[id(weights)] = (width, width + weights.rank)
            width += weights.rank
        mask = torch.zeros((len(rows), 1, width), dtype=dtype)
        for index, row_weights in enumerate(rows):
            if row_weights is not None:
                lo, hi = offsets[id(row_weights)]
                mask[index, 0, lo:hi] = 1
        self._mask = mask.to(device)

    def _stacked_factors(self, module_name: str, x: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        if module_name in self._cat:
            return self._cat[module_name]
        found = [w.layers.get(module_name) for w in self._active]
        if all(f is None for f in found):
            self._cat[module_name] = None
            return None
        out_features = next(f[1].shape[1] for f in found if f is not None)
        a_parts, b_parts = [], []
        for weights, factors in zip(self._active, found, strict=True):
            a_t = factors[0] if factors is not None else x.new_zeros((x.shape[-1], 0))
            b_t = factors[1] if factors is not None else x.new_zeros((0, out_features))
            pad = weights.rank - a_t.shape[1]  # a smaller rank in this layer (rank_pattern), or absent
            if pad:
                a_t = torch.cat([a_t, a_t.new_zeros((a_t.shape[0], pad))], dim=1)
                b_t = torch.cat([b_t, b_t.new_zeros((pad, out_features))], dim=0)
            a_parts.append(a_t)
            b_parts.append(b_t)
        stacked = (torch.cat(a_parts, dim=1).contiguous(), torch.cat(b_parts, dim=0).contiguous())
        self._cat[module_name] = stacked
        return stacked

    def _hook(self, module_name: str) -> Any:
        def add_lora(module: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
            if not self._groups:
                return output
            x = args[0]
            if x.shape[0] != self._rows:
                raise RuntimeError(f"LoRA rows were set for a batch of {self._rows}, the forward has {x.shape[0]}")
            if self.strategy == "stacked":
                factors = self._stacked_factors(module_name, x)
                if factors is None:
                    return output
                h = x @ factors[0]
                if self._mask is not None:
                    h = h * self._mask.view(self._rows, *([1] * (x.dim() - 2)), -1)
                return output + h @ factors[1]
            for weights, rows in self._groups:
                found = weights.layers.get(module_name)
                if found is None:
                    continue
                a_t, b_t = found
                if rows is None:
                    output = output + (x @ a_t) @ b_t
                else:
                    output = output.index_add(0, rows, (x.index_select(0, rows) @ a_t) @ b_t)
            return output

        return add_lora

    def close(self) -> None:
        """Remove every hook (the model is the plain base model again)."""
        for handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()
        self._groups = []
        self._rows = 0
        self._active, self._cat, self._mask = [], {}, None


def attach_lora(config: Any, engine: Any) -> Any:
    """Give ``engine`` (HF/DeepSpeed) a :class:`LoraSet` when ``config.lora.enable_lora``; returns it."""
    opts = getattr(config, "lora", None)
    if opts is None or not opts.enable_lora:
        return engine
    tp = int(getattr(config, "tensor_parallel_degree", 1) or 1)
    if tp > 1:
        from djl_handlers.errors import ConfigError

        raise ConfigError("option.enable_lora is not supported with tensor parallelism in the "
                          f"{engine.name} engine (tensor_parallel_degree={tp})", field="option.enable_lora")
    engine.lora = LoraSet(engine.model, opts.max_loras, opts.max_lora_rank, opts.max_cpu_loras)
    return engine


def require_lora(engine: Any) -> LoraSet:
    """The engine's :class:`LoraSet`, or an error saying LoRA is off."""
    if engine.lora is None:
        from djl_handlers.lora.registry import AdapterError

        raise AdapterError("LoRA adapters are not enabled for this model; set option.enable_lora=true",
                           field="option.enable_lora")
    lora: LoraSet = engine.lora
    return lora


def use_rows(lora: Optional[LoraSet], rows: Sequence[Any]) -> None:
    """Before a forward: the adapters of its rows (objects with a ``lora`` attribute), in order."""
    if lora is not None:
        lora.use([row.lora for row in rows])


def admits_row(engine: Any, row: Any, extra: Sequence[Any] = ()) -> bool:
    """``max_loras``: may ``row`` join ``engine``'s running batch (plus ``extra`` rows being admitted)?"""
    lora: Optional[LoraSet] = engine.lora
    if lora is None or row.lora is None:
        return True
    batch = engine._batch
    active = [r.lora for r in batch.rows if not r.done] if batch is not None else []
    if engine._partial is not None:
        active.append(engine._partial.row.lora)
    return lora.admits(active + [r.lora for r in extra], row.lora)
