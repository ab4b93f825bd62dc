"""Int8 linear layers for the HF engine on the CPU (``option.quantize=dynamic_int8``).

Each plain ``nn.Linear`` is replaced at load by an :class:`Int8Linear`: its weight quantized once
to int8, symmetric, one fp32 scale per output channel (``scale = max|w_row| / 127``); the fp32 (or
16-bit) weight is dropped, so the layers hold about a quarter of their fp32 bytes. A call quantizes
its activations on the fly, per row (``round(x * 127 / max|x|)``), sums the integer products in int32
and scales back to fp32. LMI's name for int8 weights quantized at load (DeepSpeed's ``dynamic_int8``)
and torch's name for this scheme ("dynamic quantization") agree.

The GEMM is the package's C kernel (:mod:`djl_handlers.kernels.int8_gemm`: AVX-512 VNNI, AVX-VNNI,
AVX2 or portable C, the same bits on each), one ctypes call per layer. Where it cannot be built (no C
compiler) the layers run torch's fbgemm (``quantized::linear_dynamic``, the kernel of torch's
``quantize_dynamic``) instead; a process uses one of the two for every call, so rows never mix them.

Row independence: the kernel scales each row by its own peak, so a row's integer sums (exact) and
its scaling depend on that row alone. fbgemm quantizes the whole input with one scale from its
minimum and maximum, so there each row is divided by its own ``max|x|`` and two fixed rows, all +1
and all -1, are appended: the range is then [-1, 1] in every call and the activation scale and zero
point are constants. Greedy output of the batched engine equals ``generate()`` one request at a time
on the same quantized model. Activations use the full 8 bits: torch's x86 default of 7 bits
(``reduce_range``) doubled the log-likelihood distance to fp32 on the embedded model.

Saturation: on a CPU without AVX-512 VNNI (AVX2-only CPUs such as AMD Zen 3) fbgemm multiplies the
unsigned 8-bit activations by the int8 weights with ``vpmaddubsw``, which adds each pair of products
in 16 bits and saturates: 255 x 127 x 2 = 64,770 does not fit, and the result is silently wrong (on
the embedded model, a greedy token fp32 prefers by a logit gap of 4 flipped). The package's kernel
never saturates (its AVX2 path multiplies ``|x|`` by the weight carrying ``x``'s sign: at most
2 x 127 x 127 per pair). Under fbgemm, :func:`weight_limit` finds out at load, with a call whose exact
answer is known, whether this CPU's kernel saturates; where it does, weights are quantized to
[-64, 64] (255 x 64 x 2 = 32,640 fits). The choice is logged.

Sibling projections (q/k/v, gate/up) share one GEMM over their concatenated weights
(:class:`Int8Sibling`), as ``option.cpu_fuse_projections`` does for the fp32 layers, and a SiLU MLP
over a shared gate/up GEMM runs ``down_proj(silu_mul(gate_up(x)))`` (:func:`fuse_mlps`). Measured
against fp32 in docs/engines.md, "Int8 on the CPU"; the weight-only ``aten._weight_int8pack_mm`` and
inductor's ``onednn.qlinear_pointwise`` were slower than fbgemm, and fbgemm than the kernel.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any

import torch

from djl_handlers.errors import ConfigError
from djl_handlers.kernels import int8_gemm

LOG = logging.getLogger(__name__)

NAME = "dynamic_int8"
_ENGINES = ("x86", "fbgemm")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TINY = torch.finfo(torch.float32).tiny


def unavailable_reason() -> str | None:
    """Why neither the package's int8 kernel nor torch's fbgemm can run :class:`Int8Linear` here
    (None when one can)."""
    if int8_gemm.available():
        return None
    engines = torch.backends.quantized.supported_engines
    kernel = f"the int8 kernel cannot be built ({int8_gemm.unavailable_reason()})"
    if not any(engine in engines for engine in _ENGINES):
        return f"{kernel}, and this torch has no fbgemm quantized engine (it has {', '.join(engines) or 'none'})"
    if not hasattr(torch.ops.quantized, "linear_dynamic"):
        return f"{kernel}, and this torch has no quantized::linear_dynamic"
    return None


def backend() -> str:
    """Which GEMM runs the int8 layers here: the package's kernel (with its instruction path) or fbgemm."""
    found = int8_gemm.path()
    return f"the package's int8 kernel ({found})" if found else "fbgemm (torch.ops.quantized.linear_dynamic)"


FULL_RANGE = 127  # int8 weights in [-127, 127]
SAFE_RANGE = 64  # where the kernel adds product pairs in 16 bits: 255 * 64 * 2 fits in an int16


def quantize_weight(weight: torch.Tensor, limit: int = FULL_RANGE) -> tuple[torch.Tensor, torch.Tensor]:
    """``(int8 [out, in], fp32 scales [out])``: symmetric per-output-channel int8 of ``weight``, its
    values in ``[-limit, limit]``."""
    weight = weight.detach().float()
    scales = (weight.abs().amax(dim=1) / limit).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(weight / scales[:, None]).clamp_(-limit, limit).to(torch.int8)
    return q, scales


def _pack(q: torch.Tensor, scales: torch.Tensor) -> Any:
    zeros = torch.zeros(scales.numel(), dtype=torch.int64)
    with warnings.catch_warnings():  # torch marks its quantized tensor types deprecated; fbgemm takes them
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch._make_per_channel_quantized_tensor(q, scales.double(), zeros, 0)
    return torch.ops.quantized.linear_prepack(qweight, None)


def saturates() -> bool:
    """Whether this CPU's fbgemm kernel adds pairs of products in 16 bits with saturation: a row of
    +1 (unsigned 255) against weights of 127 must give ``127 * n``; a saturating kernel gives far less."""
    n = 64
    packed = _pack(torch.full((2, n), FULL_RANGE, dtype=torch.int8), torch.ones(2))
    rows = torch.ones(2, n)
    rows[1] = -1.0  # the layer's fixed [-1, 1] range
    got = float(torch.ops.quantized.linear_dynamic(rows, packed, False)[0, 0])
    return abs(got - FULL_RANGE * n) > 0.05 * FULL_RANGE * n


@functools.cache
def weight_limit() -> int:
    """The weight range the int8 GEMM computes exactly here: :data:`FULL_RANGE` with the package's
    kernel (no path of it saturates) or a 32-bit fbgemm kernel, :data:`SAFE_RANGE` where fbgemm
    saturates; decided once per process and logged."""
    if int8_gemm.available():
        LOG.info("int8: %s sums exactly; weights use [-%d, %d]", backend(), FULL_RANGE, FULL_RANGE)
        return FULL_RANGE
    if saturates():
        LOG.info("int8: this CPU's fbgemm kernel adds product pairs in 16 bits (no AVX-512 VNNI); "
                 "weights use [-%d, %d] so no sum saturates", SAFE_RANGE, SAFE_RANGE)
        return SAFE_RANGE
    LOG.info("int8: this CPU's fbgemm kernel sums in 32 bits; weights use [-%d, %d]", FULL_RANGE, FULL_RANGE)
    return FULL_RANGE


class Int8Linear(torch.nn.Module):
    """``x @ W.T + b`` over an int8 ``W`` with per-output-channel fp32 scales (see the module docstring)."""

    def __init__(self, module: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = module.in_features
        self.out_features = module.out_features
        q, scales = quantize_weight(module.weight, weight_limit())
        self.kernel = int8_gemm.pack(q, scales)  # our kernel's layout, or None: fbgemm's below
        self.packed = _pack(q, scales) if self.kernel is None else None
        self.register_buffer("scales", scales)
        bias = module.bias
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float(), requires_grad=False)
        self.dtype = module.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        flat = x.reshape(-1, self.in_features)
        if flat.dtype != torch.float32:
            flat = flat.float()
        if self.kernel is not None:
            if flat.stride(-1) != 1:
                flat = flat.contiguous()
            out = int8_gemm.gemm(flat, self.kernel, self.bias)
            assert out is not None  # the kernel packed the weight, so it is loaded
        else:
            out = self._fbgemm(flat)
        if dtype != torch.float32:
            out = out.to(dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _fbgemm(self, flat: torch.Tensor) -> torch.Tensor:
        # few eager ops (a decode step of one row is bound by their count, not by the GEMM): the
        # scaled rows are written into a buffer beside the two fixed rows (+1, -1), and the
        # rescale and bias are applied in place; the values are those of the plain expression
        # ``linear_dynamic(cat([x / peak, +1, -1]))[:-2] * peak + bias``
        n = flat.shape[0]
        peak = torch.linalg.vector_norm(flat, float("inf"), dim=1, keepdim=True).clamp_min_(_TINY)
        rows = torch.empty(n + 2, self.in_features)
        rows[n].fill_(1.0)
        rows[n + 1].fill_(-1.0)
        torch.div(flat, peak, out=rows[:n])
        out = torch.ops.quantized.linear_dynamic(rows, self.packed, False)[:n].mul_(peak)
        if self.bias is not None:
            out.add_(self.bias)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


class Int8Sibling(torch.nn.Module):
    """One of sibling projections (q/k/v, gate/up) quantized as one :class:`Int8Linear` over their
    concatenated weights: the first sibling called with a tensor runs the shared GEMM, the others
    called with the same tensor (same in-place version) take their columns of it. The values are
    bitwise those of separate layers (the same per-row activation scale, per-channel weight scales
    and exact integer sums)."""

    def __init__(self, shared: Int8Linear, start: int, stop: int, last: list[Any]) -> None:
        super().__init__()
        self.__dict__["shared"] = shared  # not a submodule: the siblings share it
        # [input, its version, output, the siblings served, how many siblings] of the latest shared GEMM
        self.__dict__["last"] = last
        self.in_features, self.out_features = shared.in_features, stop - start
        self.start, self.stop = start, stop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = self.__dict__["last"]
        version = -1 if x.is_inference() else int(x._version)
        if not (last[0] is x and last[1] == version and self.start not in last[3]):
            last[:4] = [x, version, self.__dict__["shared"](x), set()]
        out = last[2][..., self.start:self.stop]  # a view, as the fused fp32 projections give
        last[3].add(self.start)
        if len(last[3]) == last[4]:  # every sibling has its columns: keep no activations between calls
            last[:4] = [None, -2, None, set()]
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel, shared GEMM"


class Int8Pair:
    """A gate/up pair of :class:`Int8Sibling` modules over one shared GEMM, as
    :class:`~djl_handlers.engines.hf.cpu.fused.FusedMLP` takes it: ``down_proj(silu_mul(gate_up(x)))``
    with the SiLU and the product in one C pass, as the fp32 layers' fused MLPs run."""

    def __init__(self, gate: Int8Sibling, up: Int8Sibling) -> None:
        self.modules = [gate, up]
        self.shared: Int8Linear = gate.__dict__["shared"]

    @property
    def dtype(self) -> torch.dtype:
        return self.shared.dtype

    def full(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(x)


def _pair(gate: Any, up: Any) -> Int8Pair | None:
    """The :class:`Int8Pair` of ``gate`` and ``up`` when they are the two halves of one shared GEMM."""
    if not (isinstance(gate, Int8Sibling) and isinstance(up, Int8Sibling)):
        return None
    shared = gate.__dict__["shared"]
    if (up.__dict__["shared"] is not shared or gate.start != 0 or up.start != gate.stop
            or up.stop != shared.out_features or gate.out_features != up.out_features):
        return None
    return Int8Pair(gate, up)


def _share(linears: list[torch.nn.Linear]) -> list[Int8Sibling]:
    """``linears`` (siblings with one input) as :class:`Int8Sibling` modules over one shared int8 GEMM."""
    joined = torch.nn.Linear(linears[0].in_features, sum(m.out_features for m in linears),
                             bias=linears[0].bias is not None, device="meta")
    joined.weight = torch.nn.Parameter(torch.cat([m.weight.detach() for m in linears]), requires_grad=False)
    if joined.bias is not None:
        joined.bias = torch.nn.Parameter(torch.cat([m.bias.detach() for m in linears]), requires_grad=False)
    last: list[Any] = [None, -2, None, set(), len(linears)]
    shared, start, members = Int8Linear(joined), 0, []
    for module in linears:
        members.append(Int8Sibling(shared, start, start + module.out_features, last))
        start += module.out_features
    return members


def quantize_linears(model: Any, share: bool = True) -> int:
    """Replace every plain ``nn.Linear`` of ``model`` (on the CPU) by an :class:`Int8Linear` (with
    ``share``, sibling q/k/v and gate/up projections by :class:`Int8Sibling` modules over one GEMM);
    returns how many layers. Raises ``ConfigError`` (field ``option.quantize``) when this torch
    cannot, or the model has no such layer."""
    from djl_handlers.engines.hf.cpu.fused import sibling_groups

    why = unavailable_reason()
    if why is not None:
        raise ConfigError(f"option.quantize={NAME} cannot run here: {why}; drop option.quantize to serve "
                          "in fp32 or bf16", field="option.quantize")
    targets = {id(child): (parent, name, child) for parent in model.modules()
               for name, child in parent.named_children()
               if type(child) is torch.nn.Linear and child.weight.device.type == "cpu"
               and child.weight.dtype in _DTYPES}
    if not targets:
        raise ConfigError(f"option.quantize={NAME}: the model has no plain nn.Linear layer on the CPU to "
                          "quantize (it is quantized already, or uses custom layers); drop option.quantize",
                          field="option.quantize")
    count = len(targets)
    for linears in sibling_groups(model) if share else []:
        for module, member in zip(linears, _share(linears), strict=True):
            parent, name, _ = targets.pop(id(module))
            setattr(parent, name, member)
    for parent, name, child in targets.values():
        setattr(parent, name, Int8Linear(child))
    return count


def gate_up_pairs(model: Any) -> int:
    """How many modules of ``model`` have a gate/up pair over one shared int8 GEMM."""
    return sum(_pair(getattr(m, "gate_proj", None), getattr(m, "up_proj", None)) is not None for m in model.modules())


def fuse_mlps(model: Any) -> int:
    """Give SiLU MLPs over a shared int8 gate/up GEMM the fused forward (:class:`Int8Pair`); returns how many."""
    from djl_handlers.engines.hf.cpu.fused import fuse_mlps as fuse

    return fuse(model, _pair)


def shared_groups(model: Any) -> int:
    """How many shared int8 GEMMs (sibling groups) ``model`` has."""
    return len({id(m.__dict__["shared"]) for m in model.modules() if isinstance(m, Int8Sibling)})
