"""fp32 linear layers on MKL's packed sgemm (``option.cpu_linear=auto`` where it measures faster, or ``mkl``).

torch's CPU build links Intel MKL, whose ``cblas_sgemm_pack`` stores a weight once in the layout its
sgemm kernels read (``torch.ops.mkl._mkl_reorder_linear_weight``) and whose ``cblas_sgemm_compute``
multiplies by it (``torch.ops.mkl._mkl_linear``) — the pair torch's inductor emits for frozen fp32
CPU graphs, and the one Intel's extension for PyTorch uses for fp32 linear layers. On the 2-core Intel
Xeon this project measured (docs/benchmarks.md, "fp32 GEMMs: MKL's packed sgemm and oneDNN"), the
engine served 1.10x oneDNN's tok/s at 32 concurrent requests and 1.39x at one natively, 1.14x and
1.30x capped at AVX2 (one model's GEMMs 1.04-1.51x faster from 1 to 256 rows).

Exactness the engine relies on: a row's result must not depend on the other rows of the call (so
greedy fp32 output of the batched engine equals ``generate()`` of the same loaded model). MKL keeps
that for whole blocks of rows but may sum a remainder row in another order: at the AVX2 level the
rows past the last multiple of 4 differ in the last bits when 2 or 3 remain. :func:`row_quantum`
therefore checks each weight shape once (the real packed weight, random rows, 1-17 and a few larger
row counts against one 48-row call) for the smallest block ``q`` of :data:`QUANTA` such that padding
every call to a multiple of ``q`` (the last row repeated) gives each row the same bits in any call;
a shape where no block does keeps oneDNN. The summation order is MKL's choice of kernel for the
shape and the thread count, not the data, which is why random rows prove it. The check runs at the
thread count of the load; on the embedded model's shapes MKL gave the same bits at 1 and 2 threads,
so the thread governor (``option.cpu_threads=adaptive``) lowering the count later changes nothing
there.

The packed buffer's size is what ``cblas_sgemm_pack_get_size`` asks for (several times the weight for
small shapes), but only the weight's worth of it is written: resident memory is one copy of the
weights, as for oneDNN's.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from djl_handlers.engines.hf.cpu.timing import best_times

LOG = logging.getLogger(__name__)

#: row blocks tried by :func:`row_quantum`, smallest first
QUANTA = (1, 2, 4, 8, 16)
_REFERENCE_ROWS = 48  # a multiple of every quantum
_CHECK_ROWS = (*range(1, 18), 24, 31, 33, 40)
#: the row count the packed layout is asked for (any row count runs on it): MKL blocks the weight for
#: it, and 256 measured as fast as 32 at a decode step's rows and 5-20 % faster in prefill (32 lost
#: to oneDNN there; docs/benchmarks.md)
_HINT = 256
#: rows, input and output features of the timed GEMMs: a decode step's projections and MLP
_PROBE_SHAPES = ((16, 1024, 1024), (32, 1536, 576), (32, 1024, 4096))
_PROBE_REPEATS = 9

_quanta: dict[tuple[int, int, int], int | None] = {}


def available() -> bool:
    """True when this torch build has MKL's packed sgemm on the CPU."""
    return bool(torch.backends.mkl.is_available()) and hasattr(torch.ops.mkl, "_mkl_linear")


class MklPacked:
    """An fp32 weight ``[out, in]`` in MKL's packed layout, and the row block its calls are padded to."""

    dtype = torch.float32

    def __init__(self, weight: torch.Tensor, quantum: int = 1) -> None:
        weight = weight.detach().to(torch.float32).contiguous()
        self.out_features, self.in_features = (int(n) for n in weight.shape)
        self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, _HINT)
        # ``_mkl_linear`` reads only the size of its unpacked weight argument when the row count it
        # is told equals the call's (always, here): a zero-stride view stands in for the real one
        self._sized = torch.empty(1).expand(self.out_features, self.in_features)
        self.quantum = quantum

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias`` for an fp32 ``x`` of any leading shape."""
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.in_features)
        rows = int(flat.shape[0])
        if rows == 0:
            return x.new_zeros(*lead, self.out_features)
        pad = -rows % self.quantum
        if pad:
            flat = torch.cat([flat, flat[-1:].expand(pad, -1)])
        flat = flat.contiguous()
        out = torch.ops.mkl._mkl_linear(flat, self.packed, self._sized, bias, int(flat.shape[0]))
        if pad:
            out = out[:rows]
        return out.reshape(*lead, self.out_features)


def pack(weight: torch.Tensor) -> MklPacked | None:
    """``weight`` packed for MKL with its shape's row block (:func:`row_quantum`); None where no
    block keeps a row's result independent of the call (the caller keeps oneDNN)."""
    packed = MklPacked(weight)
    quantum = row_quantum(packed)
    if quantum is None:
        return None
    packed.quantum = quantum
    return packed


def row_quantum(packed: MklPacked) -> int | None:
    """The smallest block of :data:`QUANTA` for which padded calls give each row the same bits in any
    call on this weight's shape at the current thread count (checked once per shape; see the module
    doc); None when none does."""
    key = (packed.out_features, packed.in_features, torch.get_num_threads())
    if key not in _quanta:
        _quanta[key] = _find_quantum(packed)
        LOG.debug("MKL sgemm %dx%d at %d threads: rows in blocks of %s", *key, _quanta[key])
    return _quanta[key]


def _find_quantum(packed: MklPacked) -> int | None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(_REFERENCE_ROWS, packed.in_features, generator=gen)
    saved = packed.quantum
    try:
        with torch.inference_mode():
            for quantum in QUANTA:
                packed.quantum = quantum
                whole = packed(x, None)
                if all(torch.equal(packed(x[:rows], None), whole[:rows]) for rows in _CHECK_ROWS):
                    return quantum
    finally:
        packed.quantum = saved
    return None


def probe_speed() -> float | None:
    """oneDNN's time over MKL's for the prepacked fp32 GEMMs of :data:`_PROBE_SHAPES` (each the best
    of :data:`_PROBE_REPEATS`, interleaved; ~30 ms): above 1 where MKL is faster here; None where
    either path fails."""
    if not available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return None
    try:
        gen = torch.Generator().manual_seed(0)
        calls: list[Callable[[], object]] = []  # per shape: oneDNN's call, then MKL's
        for rows, k, n in _PROBE_SHAPES:
            weight, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
            onednn = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
            calls.append(functools.partial(torch.ops.mkldnn._linear_pointwise, x, onednn, None, "none", [], ""))
            calls.append(functools.partial(MklPacked(weight), x, None))
        with torch.inference_mode():
            best = best_times(calls, _PROBE_REPEATS)
        return round(sum(best[0::2]) / sum(best[1::2]), 3)
    except (RuntimeError, AttributeError, ZeroDivisionError):
        return None
