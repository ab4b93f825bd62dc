"""Sibling projections as one prepacked GEMM on the CPU (``option.cpu_fuse_projections``).

A Llama-family decoder layer multiplies the same hidden states by three weights for query, key
and value (``q_proj``, ``k_proj``, ``v_proj``) and by two for the MLP (``gate_proj``, ``up_proj``).
With the few rows of a decode step each GEMM is short and ends at an OpenMP barrier; one GEMM over
the concatenated weight reads the same bytes in one call. Measured side by side on this project's
2-core box (docs/benchmarks.md, "CPU kernels"): those five projections take 1.9x less time at 16 rows and
1.35-1.56x less at 32 rows, in fp32 and bf16.

How it plugs into an unchanged HF forward: every member of a group gets a :class:`FusedMember`
``forward``. The first member called with a tensor ``x`` runs the fused GEMM (over the weight
concatenated and reordered once, :func:`~djl_handlers.engines.hf.cpu.linear.reorder`) and keeps
the per-member column slices; a sibling then called with the same tensor object (and, for tensors
that have one, the same in-place version, its weight unchanged) gets its slice without a GEMM. Any other call — another
input, a member called twice, a forward pre-hook that replaced the input — computes the fused GEMM
again, so a member's result never depends on call order. Modules, parameters, forward hooks (our
LoRA hooks add to the slice out of place) and ``state_dict`` are unchanged; only ``forward`` is
replaced on the instance, as in :mod:`~djl_handlers.engines.hf.cpu.linear`.

Exactness: a row's fused result does not depend on how many rows are in the call (a lone row is
run twice, as for the single layers), so greedy fp32 output of the batched engine still equals
``generate()`` of the same loaded model; against unfused layers the values differ in the last bits
(another GEMM blocking). The slices are views with the fused row stride; a model whose code cannot
take such a view (``.view`` over a flattened slice) would fail, so :func:`fuse_projections` runs the
model once on a short input before and after fusing and undoes the fusion if the forward raises or
its logits differ by more than rounding.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch

from djl_handlers.engines.hf.cpu.linear import Packed, PackedLinear, reorder, run_packed, weight_version
from djl_handlers.engines.hf.cpu.linear import available as onednn_available
from djl_handlers.kernels import silu_mul as silu_kernel
from djl_handlers.kernels.silu_mul import silu_mul

LOG = logging.getLogger(__name__)

# Sibling Linear modules that take the same input in HF's Llama-family code, in call order.
GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_DTYPES = (torch.float32, torch.bfloat16)
_CHECK_IDS = (1, 2, 3, 5, 8, 13)


class ProjectionGroup:
    """The concatenated, reordered weight of sibling projections and the last fused result."""

    def __init__(self, modules: list[torch.nn.Linear], library: str = "onednn") -> None:
        self.modules = modules
        self.library = library  # where fp32 compute runs (:func:`~djl_handlers.engines.hf.cpu.linear.reorder`)
        self.sizes = [int(m.out_features) for m in modules]
        self.versions: list[int] = []
        self.packed: Packed | None = None
        self.bias: torch.Tensor | None = None
        self._x: torch.Tensor | None = None
        self._x_version = -1
        self._slices: tuple[torch.Tensor, ...] = ()
        self._pending = 0  # bit i: member i has not taken its slice of the last fused result
        self._pack()

    def _pack(self) -> None:
        self.versions = [weight_version(m.weight) for m in self.modules]
        self.packed = reorder(torch.cat([m.weight.detach() for m in self.modules]), self.library)
        biases = [m.bias for m in self.modules]
        # in the packed weight's dtype (fp32 for a bf16 model packed as ``fp32-over-bf16``)
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases]).to(self.packed.dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.modules[0].weight.dtype

    def clear(self) -> None:
        """Drop the kept result (and the reference to its input)."""
        self._x, self._slices, self._pending = None, (), 0

    def full(self, x: torch.Tensor) -> torch.Tensor:
        """The fused GEMM's whole output for ``x`` (every member's columns side by side)."""
        if [weight_version(m.weight) for m in self.modules] != self.versions:
            self._pack()
        return run_packed(x, self.packed, self.bias)  # type: ignore[arg-type]

    def run(self, slot: int, x: torch.Tensor) -> torch.Tensor:
        """Member ``slot``'s output for ``x``: its slice of the kept fused result when that was
        computed for this very tensor and not yet taken, else of a new fused GEMM."""
        bit = 1 << slot
        if (self._pending & bit and x is self._x and weight_version(x) == self._x_version
                and weight_version(self.modules[slot].weight) == self.versions[slot]):
            self._pending &= ~bit
            out = self._slices[slot]
            if not self._pending:
                self.clear()
            return out
        full = self.full(x)  # repacks first if a weight changed in place since it was packed
        self._slices = tuple(full.split(self.sizes, dim=-1))
        self._x, self._x_version = x, weight_version(x)
        self._pending = ((1 << len(self.modules)) - 1) & ~bit
        return self._slices[slot]


class FusedMember:
    """The ``forward`` of one member of a :class:`ProjectionGroup`."""

    def __init__(self, group: ProjectionGroup, slot: int, previous: Any) -> None:
        self.group = group
        self.slot = slot
        self.module = group.modules[slot]
        self.previous = previous  # the instance's own ``forward`` before fusing (None: the class's)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.module.weight
        if x.dtype != weight.dtype or x.device.type != "cpu" or weight.device.type != "cpu":
            return torch.nn.functional.linear(x, weight, self.module.bias)
        return self.group.run(self.slot, x)


class GateUp(Protocol):
    """A gate/up pair computed by one GEMM: a :class:`ProjectionGroup`, or the int8 layers' shared
    GEMM (:class:`~djl_handlers.engines.hf.cpu.int8.Int8Pair`)."""

    modules: list[Any]  # [gate_proj, up_proj]

    @property
    def dtype(self) -> torch.dtype: ...

    def full(self, x: torch.Tensor) -> torch.Tensor: ...


class FusedMLP:
    """The ``forward`` of a Llama-style MLP whose ``gate_proj``/``up_proj`` are one fused group:
    ``down_proj(silu_mul(gate_up(x)))`` — the activation and the product in one C pass
    (:mod:`djl_handlers.kernels.silu_mul`). Calls it cannot take (forward hooks on gate/up, such as
    LoRA's; gate/up replaced since fusing, e.g. wrapped by PEFT or sharded by DeepSpeed; other dtypes
    or devices; extra arguments) run the module's own forward."""

    def __init__(self, module: torch.nn.Module, group: GateUp, original: Any, previous: Any) -> None:
        self.module: Any = module
        self.group = group
        self.original = original
        self.previous = previous  # the instance's own ``forward`` before (None: the class's)

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        m = self.module
        gate, up = m.gate_proj, m.up_proj
        members = self.group.modules
        if (gate is not members[0] or up is not members[1]  # replaced since (a wrapper, a sharded layer)
                or args or kwargs or not isinstance(x, torch.Tensor) or x.dtype != self.group.dtype or not x.is_cpu
                or gate._forward_hooks or up._forward_hooks or gate._forward_pre_hooks or up._forward_pre_hooks
                or _global_hooks()):
            return self.original(x, *args, **kwargs)
        hidden = silu_mul(self.group.full(x))
        if hidden is None:
            return self.original(x, *args, **kwargs)
        return m.down_proj(hidden)


def _global_hooks() -> bool:
    """True when module hooks are registered for every module (``register_module_forward_hook``)."""
    from torch.nn.modules import module as nn_module

    return bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks)


def _silu(act: Any) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _fused_pair(gate: Any, up: Any) -> ProjectionGroup | None:
    """The :class:`ProjectionGroup` of a fused gate/up pair (gate first, equal halves), else None."""
    g_fwd, u_fwd = (getattr(m, "__dict__", {}).get("forward") for m in (gate, up))
    if (isinstance(g_fwd, FusedMember) and isinstance(u_fwd, FusedMember) and g_fwd.group is u_fwd.group
            and g_fwd.slot == 0 and u_fwd.slot == 1 and g_fwd.group.sizes[0] == g_fwd.group.sizes[1]):
        return g_fwd.group
    return None


def fuse_mlps(model: Any, pair: Callable[[Any, Any], GateUp | None] = _fused_pair) -> int:
    """Give every MLP whose gate/up pair is one GEMM (``pair`` finds it) and whose activation is SiLU a
    :class:`FusedMLP` forward, when its output matches its own forward on random inputs; returns how many."""
    if not silu_kernel.available():
        return 0
    count = 0
    for module in model.modules():
        gate, up, down = (getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj"))
        if (gate is None or up is None or not isinstance(down, torch.nn.Module)
                or not _silu(getattr(module, "act_fn", None))):
            continue
        group = pair(gate, up)
        if group is None:
            continue
        previous = module.__dict__.get("forward")
        fused = FusedMLP(module, group, module.forward, previous)
        if not _mlp_matches(fused, group.dtype, int(gate.in_features)):
            continue
        module.forward = fused
        count += 1
    return count


def _mlp_matches(fused: FusedMLP, dtype: torch.dtype, width: int) -> bool:
    gen = torch.Generator().manual_seed(0)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    with torch.inference_mode():
        for shape in ((3, width), (2, 4, width), (1, 1, width)):
            x = torch.randn(*shape, generator=gen).to(dtype)
            want, got = fused.original(x), fused(x)
            if not isinstance(want, torch.Tensor) or want.shape != got.shape:
                return False
            scale = float(want.abs().max()) or 1.0
            if float((want.float() - got.float()).abs().max()) > tol * scale:
                return False
    return True


def sibling_groups(model: Any) -> list[list[torch.nn.Linear]]:
    """Sibling projections of ``model`` that can share one GEMM: plain ``nn.Linear`` modules under
    one parent, named as in :data:`GROUPS`, with the same input size, dtype and bias presence, on
    the CPU in fp32 or bf16, and without forward pre-hooks."""
    found: list[list[torch.nn.Linear]] = []
    for parent in model.modules():
        children = dict(parent.named_children())
        for names in GROUPS:
            members = [children.get(name) for name in names]
            if not all(type(m) is torch.nn.Linear for m in members):
                continue
            linears: list[torch.nn.Linear] = members  # type: ignore[assignment]
            first = linears[0].weight
            if first.device.type != "cpu" or first.dtype not in _DTYPES:
                continue
            if any(m.weight.dtype != first.dtype or m.weight.device != first.device or m.weight.dim() != 2
                   or m.in_features != linears[0].in_features or (m.bias is None) != (linears[0].bias is None)
                   or m._forward_pre_hooks for m in linears):
                continue
            found.append(linears)
    return found


def _apply(groups: list[list[torch.nn.Linear]], library: str) -> None:
    for linears in groups:
        group = ProjectionGroup(linears, library)
        for slot, module in enumerate(linears):
            previous = module.__dict__.get("forward")
            if isinstance(previous, PackedLinear):
                previous.packed, previous.version = None, -2  # its own copy is not needed; repacked if restored
            module.forward = FusedMember(group, slot, previous)  # type: ignore[method-assign,assignment]


def _probe(model: Any) -> torch.Tensor | None:
    """The model's logits for a short fixed input (None if the forward fails)."""
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    ids = torch.tensor([[i % vocab for i in _CHECK_IDS]]) if vocab else None
    if ids is None:
        return None
    try:
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=False)
    except Exception as exc:  # noqa: BLE001 - any failure means: do not fuse
        LOG.debug("option.cpu_fuse_projections: the check forward failed: %s", exc)
        return None
    logits = getattr(out, "logits", None)
    return logits.float() if isinstance(logits, torch.Tensor) else None


def _close(want: torch.Tensor, got: torch.Tensor, dtype: torch.dtype) -> bool:
    if want.shape != got.shape or not bool(torch.isfinite(got).all()):
        return False
    scale = float(want.abs().max()) or 1.0
    tol = (3e-2 if dtype == torch.bfloat16 else 1e-3) * scale
    return float((want - got).abs().max()) <= tol


def fuse_projections(model: Any, check: bool = True, mlp: bool = True, library: str = "onednn") -> int:
    """Fuse every group of sibling projections of ``model`` (see the module doc; fp32 compute on
    ``library``'s packed layout, :func:`~djl_handlers.engines.hf.cpu.linear.reorder`) and, with ``mlp``,
    give SiLU MLPs over a fused gate/up pair a :class:`FusedMLP` forward; returns how many groups.
    With ``check``, the model runs once before and after; a failing or different forward undoes
    the fusion (logged) and returns 0."""
    if not onednn_available():
        return 0
    groups = sibling_groups(model)
    if not groups:
        return 0
    dtype = groups[0][0].weight.dtype
    want = _probe(model) if check else None
    _apply(groups, library)
    if mlp:
        fuse_mlps(model)
    if check:
        got = _probe(model)
        if want is None or got is None or not _close(want, got, dtype):
            unfuse_projections(model)
            LOG.debug("option.cpu_fuse_projections: this model's forward does not take the fused projections; "
                     "each projection stays its own GEMM")
            return 0
    return len(groups)


def unfuse_projections(model: Any) -> int:
    """Undo :func:`fuse_projections` (each member's forward before fusing); returns how many members."""
    count = 0
    for module in model.modules():
        mlp = module.__dict__.get("forward")
        if isinstance(mlp, FusedMLP):
            if mlp.previous is None:
                del module.forward
            else:
                module.forward = mlp.previous
    for module in model.modules():
        fused = module.__dict__.get("forward")
        if isinstance(fused, FusedMember):
            fused.group.clear()
            if fused.previous is None:
                del module.forward
            else:
                if isinstance(fused.previous, PackedLinear):
                    fused.previous._pack()
                module.forward = fused.previous
            count += 1
    return count
