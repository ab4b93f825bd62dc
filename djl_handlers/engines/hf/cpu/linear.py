"""oneDNN linear layers with prepacked weights for the HF engine on the CPU (``option.cpu_linear``).

``torch.nn.functional.linear`` on the CPU hands fp32 weights to a BLAS that re-reads the plain
``[out, in]`` matrix on every call; with the few rows of a decode step (and the weights far larger
than the caches) that reached about half the memory bandwidth here. oneDNN can reorder a weight
once into its blocked layout (``torch.ops.mkldnn._reorder_linear_weight``) and run every later
call on it (``torch.ops.mkldnn._linear_pointwise``) — the same pair torch's own inductor emits for
frozen CPU graphs. Measured on this project's 2-core box (docs/benchmarks.md, "What the defaults rest
on"; docs/engines.md): the 210 linear layers of SmolLM2-135M take 1.8-2.4x less time at 16-32 rows in
fp32, 1.4x in prefill, 1.2-1.7x in bf16.

Each plain ``nn.Linear`` keeps its module, parameters and hooks (PEFT, our LoRA hooks and
``state_dict`` see nothing different); only its ``forward`` is replaced on the instance by a
:class:`PackedLinear` that holds the reordered copy (extra memory: one copy of the linear weights).
A weight changed in place afterwards (its tensor ``_version`` moves) is packed again on the next call.

16-bit dtypes on every CPU: oneDNN's bf16 linear needs AVX-512 (or AVX-NE-CONVERT), its fp16 linear
AVX512-FP16 or AMX-FP16; elsewhere (an AVX2 CPU, or ``ONEDNN_MAX_CPU_ISA`` capped lower) a 16-bit
weight is widened to fp32 once when it is packed, and each call computes in fp32 and rounds the
result to the model's dtype (:func:`~djl_handlers.engines.hf.cpu.isa.linear_path`: ``fp32-over-bf16``).
The model's own parameters stay bf16; the packed copy is fp32
(twice the bf16 weights' bytes). Measured on AVX2: 2.9-4.8x faster than torch's own bf16 linear at
16-256 rows, and the values are at least as exact (fp32 products and sums, one rounding).

Exactness: oneDNN's fp32 result for a row does not depend on how many rows are in the call,
except that a one-row call takes another kernel path; ``PackedLinear`` therefore runs a lone row
as two (the row twice). So a row gets the same bits alone (sequential ``generate()``) as in any
batch, and greedy fp32 output of the batched engine equals ``generate()`` of the same loaded model.
Against stock ``F.linear`` the values differ in the last bits (a different summation order).

fp32 compute on MKL (``option.cpu_linear=auto``, the default, or ``mkl``): where torch has MKL's
packed sgemm and it measured faster than oneDNN's fp32 GEMM here (``auto``;
:func:`~djl_handlers.engines.hf.cpu.isa.fp32_library`), an fp32 weight — or a 16-bit one widened
for ``fp32-over-<dtype>`` — is packed for MKL instead (:mod:`~djl_handlers.engines.hf.cpu.mkl_linear`,
which keeps the same row exactness by padding calls to a checked row block). Native 16-bit GEMMs
stay on oneDNN; so does a weight shape MKL cannot run row-exactly. ``option.cpu_linear=onednn``
keeps every layer on oneDNN.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from djl_handlers.engines.hf.cpu import isa, mkl_linear
from djl_handlers.engines.hf.cpu.mkl_linear import MklPacked

LOG = logging.getLogger(__name__)

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_HINT = 32  # the batch size oneDNN tunes the blocked layout for (results do not depend on it)
Packed = torch.Tensor | MklPacked  # a weight as :func:`reorder` returns it


def available() -> bool:
    """True when this torch build has oneDNN (mkldnn) on the CPU."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear:
    """The ``forward`` of one ``nn.Linear`` over its prepacked weight (oneDNN's or MKL's layout)."""

    def __init__(self, module: torch.nn.Linear, library: str = "onednn") -> None:
        self.module = module
        self.library = library
        self.version = -1
        self.packed: Packed | None = None
        self._pack()

    def _pack(self) -> None:
        weight = self.module.weight
        self.version = weight_version(weight)
        self.packed = reorder(weight, self.library)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.module.weight
        if x.dtype != weight.dtype or x.device.type != "cpu" or weight.device.type != "cpu":
            return torch.nn.functional.linear(x, weight, self.module.bias)
        if weight_version(weight) != self.version:  # changed in place since it was packed
            self._pack()
        return run_packed(x, self.packed, self.module.bias)  # type: ignore[arg-type]


def run_packed(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` over a weight reordered by :func:`reorder`; a lone row is run as two
    identical rows on oneDNN (its one-row path sums in another order), rows in the checked block on
    MKL. A bf16 ``x`` over a weight packed in fp32 (``fp32-over-bf16``) is computed in fp32 and
    returned in bf16."""
    if x.dtype != packed.dtype:
        if bias is not None:
            bias = bias.to(packed.dtype)
        return run_packed(x.to(packed.dtype), packed, bias).to(x.dtype)
    if isinstance(packed, MklPacked):
        return packed(x, bias)
    x = x.contiguous()
    flat_rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if flat_rows == 1:
        twice = torch.cat([x.reshape(1, -1)] * 2)
        out = torch.ops.mkldnn._linear_pointwise(twice, packed, bias, "none", [], "")
        return out[:1].reshape(*x.shape[:-1], out.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def reorder(weight: torch.Tensor, library: str = "onednn") -> Packed:
    """``weight`` ([out, in]) reordered once into oneDNN's blocked layout, or for fp32 compute with
    ``library="mkl"`` into MKL's packed one (oneDNN's where MKL cannot run the shape row-exactly); a
    bf16 (fp16) weight is widened to fp32 first where oneDNN has no path for it
    (:func:`~djl_handlers.engines.hf.cpu.isa.linear_path`)."""
    weight = weight.detach()
    if isa.linear_path(str(weight.dtype).removeprefix("torch.")).startswith("fp32-over-"):
        weight = weight.float()
    if library == "mkl" and weight.dtype == torch.float32:
        packed = mkl_linear.pack(weight)
        if packed is not None:
            return packed
    return torch.ops.mkldnn._reorder_linear_weight(weight, _HINT)


def libraries(model: Any) -> dict[str, int]:
    """How many packed weights of ``model`` (a fused group's counted once) run on each library:
    ``{"mkl": n, "onednn": m}``."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        forward = module.__dict__.get("forward")
        for holder in (forward, getattr(forward, "group", None)):
            packed = getattr(holder, "packed", None)
            if packed is not None:
                seen[id(packed)] = packed
    counts = {"mkl": 0, "onednn": 0}
    for packed in seen.values():
        counts["mkl" if isinstance(packed, MklPacked) else "onednn"] += 1
    return counts


def describe_libraries(model: Any) -> str:
    """:func:`libraries` as the load log says it, e.g. ``9 on MKL, 2 on oneDNN``."""
    names = {"mkl": "MKL", "onednn": "oneDNN"}
    return ", ".join(f"{n} on {names[name]}" for name, n in libraries(model).items() if n)


def weight_version(weight: torch.Tensor) -> int:
    """The tensor's in-place version counter (-1 for inference tensors, which have none). Asked on
    every fused projection call (decode inputs are inference tensors): no exception on that path."""
    return -1 if weight.is_inference() else int(weight._version)


def prepack_linears(model: Any, library: str = "onednn") -> int:
    """Give every plain ``nn.Linear`` of ``model`` (on the CPU, fp32, bf16 or fp16) a :class:`PackedLinear`
    forward over ``library``'s layout for fp32 compute (:func:`reorder`); returns how many. Subclasses
    (quantized or PEFT layers) are left alone; PEFT's wrappers call their base ``nn.Linear``, which is
    packed."""
    if not available():
        LOG.debug("option.cpu_linear=onednn: this torch has no oneDNN; using torch's linear")
        return 0
    count = 0
    for module in model.modules():
        if type(module) is not torch.nn.Linear:
            continue
        weight = module.weight
        if weight.device.type != "cpu" or weight.dtype not in _DTYPES or weight.dim() != 2:
            continue
        module.forward = PackedLinear(module, library)  # type: ignore[method-assign,assignment]
        count += 1
    return count


def unpack_linears(model: Any) -> int:
    """Undo :func:`prepack_linears` (the class's own ``forward`` again); returns how many. Projections
    that :mod:`~djl_handlers.engines.hf.cpu.fused` fused are unfused first
    (:func:`~djl_handlers.engines.hf.cpu.patches.revert` does both)."""
    count = 0
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), PackedLinear):
            del module.forward
            count += 1
    return count
