"""option.dtype=auto per device (djl_handlers.engines.hf.dtype)."""

from __future__ import annotations

from pathlib import Path

import pytest

from djl_handlers.engines.hf.dtype import checkpoint_dtype, cpu_has_native_bf16, resolve_auto

pytest_plugins = ["conftest_models"]  # fixtures: tiny_dir

SAPPHIRE = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
SKYLAKE = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\n"


def test_native_bf16_comes_from_the_cpu_flags() -> None:
    assert cpu_has_native_bf16(SAPPHIRE)
    assert not cpu_has_native_bf16(SKYLAKE)
    assert cpu_has_native_bf16("flags : avx2 amx_bf16\n")


@pytest.mark.parametrize(
    ("device", "stored", "native", "want"),
    [
        ("cpu", "bfloat16", True, "bfloat16"),  # native bf16: the fast path
        ("cpu", "float16", True, "bfloat16"),  # no fast fp16 on CPU
        ("cpu", "bfloat16", False, "float32"),  # emulated bf16 is slower than fp32
        ("cpu", "float32", True, "float32"),  # never below the checkpoint's precision
        ("cpu", None, True, "float32"),
        ("cuda:0", "bfloat16", False, "auto"),  # GPU: the checkpoint's dtype
    ],
)
def test_auto_per_device(device: str, stored: str | None, native: bool, want: str) -> None:
    assert resolve_auto(device, stored, native) == want


def test_checkpoint_dtype_reads_the_config(tiny_dir: Path, tmp_path: Path) -> None:
    assert checkpoint_dtype(str(tiny_dir), local_files_only=True) in ("float32", "bfloat16", "float16")
    assert checkpoint_dtype(str(tmp_path), local_files_only=True) is None  # no config: unknown


def test_engine_load_with_auto_uses_the_resolved_dtype(tiny_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.hf.engine import HFEngine

    engine = HFEngine.from_config(ServingConfig.from_properties({"model_id": str(tiny_dir), "dtype": "auto"}))
    want = resolve_auto("cpu", checkpoint_dtype(str(tiny_dir), local_files_only=True))
    assert next(engine.model.parameters()).dtype == getattr(torch, want)
