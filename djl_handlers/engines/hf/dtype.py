"""``option.dtype=auto`` for the transformers engines: what "the checkpoint's dtype" means per device.

- GPU (``cuda``/``xpu``/...): the checkpoint's dtype (transformers' own ``dtype="auto"``).
- CPU: **bf16 when the checkpoint is stored in a 16-bit type and the CPU computes bf16 natively**
  (AVX512-BF16 or AMX: one bf16 dot product per instruction; measured ~1.8x fp32 on this workload),
  otherwise **fp32**: fp16 has no fast CPU kernels and bf16 without native support is emulated
  (slower than fp32), and an fp32 checkpoint stays fp32.

The default when ``option.dtype`` is unset stays ``fp32`` (docs/configuration.md says why).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU flags (``/proc/cpuinfo``) include AVX512-BF16 or AMX-BF16; elsewhere
    (no ``/proc``), torch's own AVX512-BF16 probe."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    if cpuinfo:
        flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split()}
        return any(f in flags for f in _NATIVE_BF16_FLAGS)
    try:
        import torch

        return bool(torch.cpu._is_avx512_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


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
