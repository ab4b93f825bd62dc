"""``option.dtype=auto`` for the transformers engines: what "the checkpoint's dtype" means per device.

- GPU (``cuda``/``xpu``/...): the checkpoint's dtype (transformers' own ``dtype="auto"``).
- CPU: **bf16 when the checkpoint is stored in a 16-bit type and the CPU computes bf16 natively**
  (AVX512-BF16 or AMX: one bf16 dot product per instruction; measured ~1.8x fp32 on this workload on
  AMD's Zen 4) **and oneDNN's bf16 GEMM measured at least as fast as fp32 here at load**
  (:func:`~djl_handlers.engines.hf.cpu.isa.probe_speed`: an Intel Xeon with AVX512-BF16 and no AMX
  runs them slower than fp32), otherwise **fp32**: fp16 has no fast CPU kernels and bf16 without
  native support is emulated (slower than fp32), and an fp32 checkpoint stays fp32.

The default when ``option.dtype`` is unset stays ``fp32`` (docs/configuration.md says why).
"""

from __future__ import annotations

from typing import Any

from djl_handlers.engines.hf.cpu.isa import BF16_FLAGS, cpu_flags, features


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU computes bf16 natively: AVX512-BF16 or AMX-BF16 in the flags of ``cpuinfo``
    (``/proc/cpuinfo`` text) or, when not given, of this CPU **and** oneDNN's bf16 path usable here
    (:mod:`~djl_handlers.engines.hf.cpu.isa`: ``ONEDNN_MAX_CPU_ISA`` can cap it below the flags) and
    measured as fast as fp32's."""
    if cpuinfo is not None:
        flags = cpu_flags(cpuinfo)[1]
        return any(f in flags for f in BF16_FLAGS)
    return features().native_bf16


def checkpoint_dtype(model_id: str, **kwargs: Any) -> str | None:
    """The checkpoint's stored dtype name (``bfloat16``, ``float16``, ``float32``) from its config."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_id, **kwargs)
    except (OSError, ValueError):
        return None
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(value).removeprefix("torch.") if value is not None else None


def resolve_auto(device: str, stored: str | None, native_bf16: bool | None = None) -> str:
    """``auto`` → ``"auto"`` (GPU: transformers reads the checkpoint), ``"bfloat16"`` or ``"float32"`` (CPU)."""
    if not device.startswith("cpu"):
        return "auto"
    if stored in ("bfloat16", "float16"):
        if native_bf16 if native_bf16 is not None else cpu_has_native_bf16():
            return "bfloat16"
    return "float32"
