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

Where oneDNN has a 16-bit path, whether it pays is measured, not read off the flags: an Intel Xeon with
AVX512-BF16 but no AMX (5th generation, under KVM) ran oneDNN's bf16 GEMMs at 0.53-0.68x its fp32 ones
over a decode step's and a prompt's shapes, while AMD's Zen 4 runs them ~1.5x faster.
:func:`probe_speed` times one packed GEMM of a decode step's size both ways at load (~20 ms);
the native path is taken where it reaches :data:`NATIVE_MIN_SPEED` of fp32's speed, else
``fp32-over-<dtype>``. ``DJL_HANDLERS_16BIT_LINEAR=native`` or ``fp32`` skips the measurement.

fp32 compute has two libraries: oneDNN and MKL's packed sgemm (:mod:`~djl_handlers.engines.hf.cpu.mkl_linear`).
:func:`fp32_library` is the choice: ``option.cpu_linear=auto`` takes MKL where one packed GEMM of a
decode step's shapes measured at load (~30 ms, :func:`~djl_handlers.engines.hf.cpu.mkl_linear.probe_speed`)
ran at least as fast as oneDNN's (:data:`MKL_MIN_SPEED`). Where the two tie, the choice can differ
from one start to the next; the values then differ in the last bits, never in row exactness.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from djl_handlers.engines.hf.cpu.timing import best_times

LOG = logging.getLogger(__name__)

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # bf16 dot products in hardware
CHOICE_ENV = "DJL_HANDLERS_16BIT_LINEAR"  # measure (default), native, fp32
#: the native 16-bit GEMM is used where it runs at least this share of fp32's speed: a near tie goes to
#: the native path, whose weights take half the bytes
NATIVE_MIN_SPEED = 0.9
_PROBE_SHAPE = (64, 1024, 1024)  # rows, input and output features of the timed GEMM
_PROBE_REPEATS = 9
_ONEDNN_BF16_FLAGS = ("avx512bw", "avx512vl", "avx512dq")
#: ``option.cpu_linear=auto`` puts fp32 compute on MKL where its packed GEMMs measured at least this
#: share of oneDNN's speed
MKL_MIN_SPEED = 1.0


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
    bf16_speed: float | None = None  # oneDNN's bf16 GEMM speed / fp32's, measured (None: not measured)
    fp16_speed: float | None = None  # the same for fp16
    mkl_speed: float | None = None  # MKL's packed fp32 GEMM speed / oneDNN's, measured (None: no MKL)

    def speed(self, short: str) -> float | None:
        """The measured speed of oneDNN's ``short`` (``bf16``/``fp16``) GEMM against fp32's."""
        return self.bf16_speed if short == "bf16" else self.fp16_speed

    def native_pays(self, short: str) -> bool:
        """oneDNN computes ``short`` here and, where measured, at least :data:`NATIVE_MIN_SPEED` of
        fp32's speed."""
        speed = self.speed(short)
        native = self.onednn_bf16 if short == "bf16" else self.onednn_fp16
        return native and (speed is None or speed >= NATIVE_MIN_SPEED)

    @property
    def native_bf16(self) -> bool:
        """bf16 dot products in hardware (AVX512-BF16 or AMX) that oneDNN will use and that measured
        as fast as fp32 here; elsewhere bf16 is a storage format only."""
        return self.native_pays("bf16") and any(f in self.flags for f in BF16_FLAGS)

    def describe(self) -> dict[str, Any]:
        """The report ``djl-handlers check`` prints (and the engine logs at load)."""
        return {"arch": self.arch, "model": self.model, "isa": self.isa,
                "atenCapability": self.aten_capability, "onednnBf16": self.onednn_bf16,
                "nativeBf16": self.native_bf16, "onednnFp16": self.onednn_fp16,
                "speedVsFp32": {"bf16": self.bf16_speed, "fp16": self.fp16_speed},
                "linearLayers": {"bf16": linear_path("bfloat16", self), "fp16": linear_path("float16", self)},
                "fp32Gemm": {"library": fp32_library("auto", self), "mklSpeedVsOnednn": self.mkl_speed},
                "limits": {k: v for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                                          "DJL_HANDLERS_KERNEL_MARCH", CHOICE_ENV)
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


def probe_speed(dtype_name: str) -> float | None:
    """fp32's time over oneDNN's ``dtype_name`` time for one packed GEMM of :data:`_PROBE_SHAPE`
    (best of :data:`_PROBE_REPEATS` each, interleaved); None where that path fails here."""
    try:
        import torch

        rows, k, n = _PROBE_SHAPE
        gen = torch.Generator().manual_seed(0)
        weight, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
        dtype = getattr(torch, dtype_name)
        pack = torch.ops.mkldnn._reorder_linear_weight
        calls = [functools.partial(torch.ops.mkldnn._linear_pointwise, a, pack(w, rows), None, "none", [], "")
                 for w, a in ((weight, x), (weight.to(dtype), x.to(dtype)))]  # fp32, then the native dtype
        with torch.inference_mode():
            fp32, native = best_times(calls, _PROBE_REPEATS)
        return round(fp32 / native, 3)
    except (RuntimeError, AttributeError, ImportError, ZeroDivisionError):
        return None


def _measured_speed(dtype_name: str, usable: bool) -> float | None:
    """The speed :class:`CpuFeatures` keeps for ``dtype_name``: measured unless :data:`CHOICE_ENV`
    decides (``native``: None, the flags decide; ``fp32``: 0.0, the fp32 path); another value is an
    error naming the variable."""
    value = os.environ.get(CHOICE_ENV, "measure")
    choice = value.strip().lower() or "measure"
    if choice not in ("measure", "native", "fp32"):
        raise ValueError(f"{CHOICE_ENV}={value!r} is invalid; allowed: measure, native, fp32")
    if not usable or choice == "native":
        return None
    if choice == "fp32":
        return 0.0
    return probe_speed(dtype_name)


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
    bf16, fp16 = probe_onednn("bfloat16"), probe_onednn("float16")
    found = CpuFeatures(arch=arch, model=model, isa=isa_level(arch, flags), aten_capability=_aten_capability(),
                        onednn_bf16=bf16, flags=flags, onednn_fp16=fp16,
                        bf16_speed=_measured_speed("bfloat16", bf16), fp16_speed=_measured_speed("float16", fp16),
                        mkl_speed=_mkl_speed())
    LOG.info("CPU: %s (%s, isa %s); torch kernels %s; packed linear layers: bf16 %s, fp16 %s "
             "(oneDNN's 16-bit GEMM speed vs fp32: bf16 %s, fp16 %s); fp32 GEMMs on %s (MKL's speed vs "
             "oneDNN's: %s)", found.model, found.arch, found.isa,
             found.aten_capability, linear_path("bfloat16", found), linear_path("float16", found),
             found.bf16_speed, found.fp16_speed, fp32_library("auto", found), found.mkl_speed)
    return found


def _mkl_speed() -> float | None:
    try:
        from djl_handlers.engines.hf.cpu import mkl_linear
    except ImportError:  # no torch
        return None
    return mkl_linear.probe_speed()


def fp32_library(choice: str, found: CpuFeatures | None = None) -> str:
    """Where the packed fp32 GEMMs run under ``option.cpu_linear=choice``: ``mkl`` for ``mkl`` where
    torch has MKL's packed sgemm, and for ``auto`` where it also measured :data:`MKL_MIN_SPEED` times
    oneDNN's speed here; ``onednn`` otherwise."""
    if choice not in ("auto", "mkl"):
        return "onednn"
    from djl_handlers.engines.hf.cpu import mkl_linear

    if not mkl_linear.available():
        return "onednn"
    if choice == "mkl":
        return "mkl"
    speed = (found or features()).mkl_speed
    return "mkl" if speed is not None and speed >= MKL_MIN_SPEED else "onednn"


def linear_path(dtype_name: str, found: CpuFeatures | None = None) -> str:
    """How the packed linear layers compute a model of ``dtype_name`` here: ``onednn-<dtype>`` where
    oneDNN computes that dtype, ``fp32-over-<dtype>`` where the weights are widened to fp32 once and
    each call computes in fp32, ``fp32`` for an fp32 model."""
    short = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype_name)
    if short is None:
        return "fp32"
    found = found or features()
    return f"onednn-{short}" if found.native_pays(short) else f"fp32-over-{short}"


def dtype_advice(dtype_name: str, found: CpuFeatures | None = None) -> str | None:
    """A warning for a 16-bit model on a CPU that does not compute that dtype natively (served all
    the same: see :func:`linear_path`), with what to do; None where the dtype is this CPU's fast path."""
    found = found or features()
    if dtype_name == "bfloat16" and found.native_bf16:
        return None
    if dtype_name not in ("bfloat16", "float16") or (dtype_name == "float16" and found.native_pays("fp16")):
        return None
    short = "bf16" if dtype_name == "bfloat16" else "fp16"
    how = ("its linear layers compute in fp32 over the 16-bit weights"
           if linear_path(dtype_name, found).startswith("fp32-over-") else "oneDNN emulates bf16 without AVX512-BF16")
    speed = found.speed(short)
    why = f"oneDNN's {short} GEMMs measured {speed}x fp32's speed here" if speed else f"no native {short}"
    return (f"option.dtype={short} on a CPU without a fast {short} path ({found.model}, isa {found.isa}: {why}): "
            f"served, {how}; option.dtype=fp32 is as fast or faster on this CPU "
            f"(docs/engines.md, \"16-bit dtypes on every CPU\")")
