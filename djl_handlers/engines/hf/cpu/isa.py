"""What this CPU can compute, as the HF engine's CPU paths see it: probed once per process, logged once.

Three readings, each from the layer that acts on it, because they can disagree (a container may cap
an ISA below what ``/proc/cpuinfo`` lists):

- the CPU's own feature flags (``/proc/cpuinfo``; ``Features`` on arm64) and its ISA level
  (``avx512_bf16``/``amx_bf16`` > ``avx512`` > ``avx2`` > ``baseline``; ``neon``/``sve`` on arm64);
- ATen's vector capability (``torch.backends.cpu.get_cpu_capability()``: what torch's own CPU kernels
  use, capped by ``ATEN_CPU_CAPABILITY``);
- whether oneDNN runs **bf16** linear layers (probed by reordering a tiny bf16 weight, so
  ``ONEDNN_MAX_CPU_ISA`` counts): torch's oneDNN bf16 path needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT
  and refuses elsewhere ("bf16 path needs the cpu support ...").

:func:`linear_path` is the choice :mod:`~djl_handlers.engines.hf.cpu.linear` makes from the last:
``onednn-bf16`` where oneDNN computes bf16, else ``fp32-over-bf16`` — the bf16 weights are widened
once into oneDNN's fp32 blocked layout and each call computes in fp32 and rounds the result to bf16.
On an AVX2 CPU that was measured 2.9-4.8x faster than torch's own bf16 linear at 16-256 rows, and
the whole engine 1.9x (docs/engines.md, "16-bit dtypes on every CPU"), so it is the fastest correct
path there. fp16 is the same with AVX512-FP16/AMX-FP16 in place of bf16 support (few CPUs have it).
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG = logging.getLogger(__name__)

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # bf16 dot products in hardware
_ONEDNN_BF16_FLAGS = ("avx512bw", "avx512vl", "avx512dq")


@dataclass(frozen=True)
class CpuFeatures:
    """One CPU as the engine's paths see it (see the module docstring)."""

    arch: str
    model: str
    isa: str  # the highest level the flags list: amx_bf16, avx512_bf16, avx512, avx2, baseline; neon/sve
    aten_capability: str  # torch's own CPU kernels (ATEN_CPU_CAPABILITY caps it)
    onednn_bf16: bool  # oneDNN runs bf16 linear layers here (ONEDNN_MAX_CPU_ISA counts)
    flags: frozenset[str]
    onednn_fp16: bool = False  # oneDNN runs fp16 linear layers here (AVX512-FP16 or AMX-FP16)

    @property
    def native_bf16(self) -> bool:
        """bf16 dot products in hardware (AVX512-BF16 or AMX) that oneDNN will use: bf16 is then
        faster than fp32; elsewhere bf16 is a storage format only."""
        return self.onednn_bf16 and any(f in self.flags for f in BF16_FLAGS)

    def describe(self) -> dict[str, Any]:
        """The report ``djl-handlers check`` prints (and the engine logs at load)."""
        return {"arch": self.arch, "model": self.model, "isa": self.isa,
                "atenCapability": self.aten_capability, "onednnBf16": self.onednn_bf16,
                "nativeBf16": self.native_bf16, "onednnFp16": self.onednn_fp16,
                "linearLayers": {"bf16": linear_path("bfloat16", self), "fp16": linear_path("float16", self)},
                "limits": {k: v for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DJL_HANDLERS_KERNEL_MARCH")
                           if (v := os.environ.get(k))}}


def cpu_flags(cpuinfo: str | None = None) -> tuple[str, frozenset[str]]:
    """The CPU's model name and feature flags from ``/proc/cpuinfo`` text (read when not given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    model, flags = "", set[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and not flags:
            flags = set(value.split())
        elif key in ("model name", "Model name", "CPU part") and not model:
            model = value.strip()
    return model or platform.processor() or "unknown", frozenset(flags)


def isa_level(arch: str, flags: frozenset[str]) -> str:
    """The highest ISA level ``flags`` list (see :class:`CpuFeatures.isa`)."""
    if arch in ("aarch64", "arm64"):
        return "sve" if "sve" in flags else "neon" if ("asimd" in flags or "neon" in flags) else "baseline"
    if "amx_bf16" in flags:
        return "amx_bf16"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if all(f in flags for f in ("avx512f", *_ONEDNN_BF16_FLAGS)):
        return "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2"
    return "baseline"


def probe_onednn(dtype_name: str) -> bool:
    """True when torch's oneDNN reorders and multiplies a weight of ``dtype_name`` (``bfloat16``,
    ``float16``) here — not only when the flags say it could: ``ONEDNN_MAX_CPU_ISA`` and torch's own
    checks decide."""
    try:
        import torch

        if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
            return False
        dtype = getattr(torch, dtype_name)
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.ones(16, 16, dtype=dtype), 2)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 16, dtype=dtype), packed, None, "none", [], "")
        return bool(out.dtype == dtype and float(out[0, 0]) == 16.0)
    except (RuntimeError, AttributeError, ImportError):
        return False


def _aten_capability() -> str:
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except (ImportError, AttributeError, RuntimeError):
        return "unknown"


@functools.cache
def features() -> CpuFeatures:
    """This process's CPU, probed once (and logged once at INFO)."""
    arch = platform.machine().lower() or "unknown"
    model, flags = cpu_flags()
    found = CpuFeatures(arch=arch, model=model, isa=isa_level(arch, flags), aten_capability=_aten_capability(),
                        onednn_bf16=probe_onednn("bfloat16"), flags=flags, onednn_fp16=probe_onednn("float16"))
    LOG.info("CPU: %s (%s, isa %s); torch kernels %s; packed linear layers: bf16 %s, fp16 %s", found.model,
             found.arch, found.isa, found.aten_capability, linear_path("bfloat16", found),
             linear_path("float16", found))
    return found


def linear_path(dtype_name: str, found: CpuFeatures | None = None) -> str:
    """How the packed linear layers compute a model of ``dtype_name`` here: ``onednn-<dtype>`` where
    oneDNN computes that dtype, ``fp32-over-<dtype>`` where the weights are widened to fp32 once and
    each call computes in fp32, ``fp32`` for an fp32 model."""
    short = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype_name)
    if short is None:
        return "fp32"
    found = found or features()
    native = found.onednn_bf16 if short == "bf16" else found.onednn_fp16
    return f"onednn-{short}" if native else f"fp32-over-{short}"


def dtype_advice(dtype_name: str, found: CpuFeatures | None = None) -> str | None:
    """A warning for a 16-bit model on a CPU that does not compute that dtype natively (served all
    the same: see :func:`linear_path`), with what to do; None where the dtype is this CPU's fast path."""
    found = found or features()
    if dtype_name == "bfloat16" and found.native_bf16:
        return None
    if dtype_name not in ("bfloat16", "float16") or (dtype_name == "float16" and found.onednn_fp16):
        return None
    short = "bf16" if dtype_name == "bfloat16" else "fp16"
    how = ("its linear layers compute in fp32 over the 16-bit weights"
           if linear_path(dtype_name, found).startswith("fp32-over-") else "oneDNN emulates bf16 without AVX512-BF16")
    return (f"option.dtype={short} on a CPU without native {short} ({found.model}, isa {found.isa}): served, "
            f"{how}; option.dtype=fp32 is faster on this CPU (docs/engines.md, \"16-bit dtypes on every CPU\")")
