"""Every CPU path on every ISA level (engines/hf/cpu/isa.py): the probe, the 16-bit linear layers' path
where oneDNN has none, and the lower ISA level run for real on this machine whatever it is.

The last test runs the CPU kernel and engine tests again in a child process with the ISA capped at
AVX2 (``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``, C kernels built for ``x86-64-v3``), so an
AVX-512 machine also proves the path an AVX2-only CPU takes, on every run.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.hf.cpu import isa  # noqa: E402
from djl_handlers.engines.hf.cpu import linear as packed_linear  # noqa: E402
from djl_handlers.engines.hf.cpu.linear import PackedLinear  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytest_plugins = ["conftest_models"]
LOWER_ISA = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "DJL_HANDLERS_KERNEL_MARCH": "x86-64-v3"}
ZEN3 = "model name\t: AMD EPYC 7R13 Processor\nflags\t\t: fpu sse sse2 avx fma avx2 bmi2\n"
SKYLAKE = "model name\t: Intel Xeon Platinum 8175M\nflags\t\t: avx avx2 fma avx512f avx512dq avx512bw avx512vl\n"
SAPPHIRE = ("model name\t: Intel Xeon 8488C\n"
            "flags\t\t: avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16 amx_bf16\n")
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve bf16\nCPU part\t: 0xd40\n"
LOWERED = all(os.environ.get(k) == v for k, v in LOWER_ISA.items())


def _features(onednn_bf16: bool, flags: str = SKYLAKE, fp16: bool = False, **speeds: float) -> isa.CpuFeatures:
    model, found = isa.cpu_flags(flags)
    return isa.CpuFeatures(arch="x86_64", model=model, isa=isa.isa_level("x86_64", found), aten_capability="AVX2",
                           onednn_bf16=onednn_bf16, flags=found, onednn_fp16=fp16, **speeds)


@pytest.mark.parametrize(("text", "arch", "level"), [
    (ZEN3, "x86_64", "avx2"), (SKYLAKE, "x86_64", "avx512"), (SAPPHIRE, "x86_64", "amx_bf16"),
    ("flags : sse sse2\n", "x86_64", "baseline"), (GRAVITON3, "aarch64", "sve"),
    ("Features : fp asimd\n", "aarch64", "neon"),
])
def test_the_isa_level_comes_from_the_flags(text: str, arch: str, level: str) -> None:
    model, flags = isa.cpu_flags(text)
    assert isa.isa_level(arch, flags) == level
    assert model != "" and (arch != "x86_64" or "avx" not in model)


def test_the_linear_path_per_dtype_and_the_advice() -> None:
    avx2, avx512, amx = _features(False, ZEN3), _features(True, SKYLAKE), _features(True, SAPPHIRE)
    assert isa.linear_path("bfloat16", avx2) == "fp32-over-bf16"
    assert isa.linear_path("bfloat16", avx512) == "onednn-bf16" and not avx512.native_bf16
    assert isa.linear_path("float16", amx) == "fp32-over-fp16"
    assert isa.linear_path("float16", _features(True, SAPPHIRE, fp16=True)) == "onednn-fp16"
    assert isa.linear_path("float32", avx2) == "fp32"
    assert isa.dtype_advice("bfloat16", amx) is None and isa.dtype_advice("float32", avx2) is None
    advice = isa.dtype_advice("bfloat16", avx2)
    assert advice and "option.dtype=bf16" in advice and "isa avx2" in advice and "fp32" in advice
    assert "emulates" in (isa.dtype_advice("bfloat16", avx512) or "")
    assert "option.dtype=fp16" in (isa.dtype_advice("float16", amx) or "")


def test_a_measured_speed_decides_whether_the_native_16_bit_path_is_taken() -> None:
    slow = _features(True, SAPPHIRE, fp16=True, bf16_speed=0.7, fp16_speed=0.5)  # a Xeon without AMX
    assert isa.linear_path("bfloat16", slow) == "fp32-over-bf16" and not slow.native_bf16
    assert isa.linear_path("float16", slow) == "fp32-over-fp16"
    advice = isa.dtype_advice("bfloat16", slow) or ""
    assert "measured 0.7x" in advice and "fp32 over the 16-bit weights" in advice
    assert "measured 0.5x" in (isa.dtype_advice("float16", slow) or "")
    fast = _features(True, SAPPHIRE, fp16=True, bf16_speed=1.5, fp16_speed=isa.NATIVE_MIN_SPEED)  # a tie: native
    assert isa.linear_path("bfloat16", fast) == "onednn-bf16" and fast.native_bf16
    assert isa.linear_path("float16", fast) == "onednn-fp16"
    assert isa.dtype_advice("bfloat16", fast) is None and isa.dtype_advice("float16", fast) is None
    assert fast.describe()["speedVsFp32"] == {"bf16": 1.5, "fp16": isa.NATIVE_MIN_SPEED}


@pytest.mark.parametrize(("choice", "usable", "expected"), [
    ("fp32", True, 0.0), ("native", True, None), ("FP32", False, None), ("measure", False, None)])
def test_the_choice_variable_forces_a_path_or_skips_the_measurement(
        choice: str, usable: bool, expected: float | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(isa.CHOICE_ENV, choice)
    monkeypatch.setattr(isa, "probe_speed", lambda name: pytest.fail("measured"))
    assert isa._measured_speed("bfloat16", usable) == expected


def test_a_wrong_choice_is_an_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(isa.CHOICE_ENV, "fast")
    with pytest.raises(ValueError, match="DJL_HANDLERS_16BIT_LINEAR='fast' is invalid; allowed: measure, native, fp32"):
        isa._measured_speed("bfloat16", True)


def test_the_speed_probe_times_both_paths_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    speed = isa.probe_speed("bfloat16")
    assert (speed is not None) == isa.probe_onednn("bfloat16")
    assert speed is None or 0.0 < speed < 100.0
    monkeypatch.setenv(isa.CHOICE_ENV, "measure")
    found = isa.features()
    assert found.bf16_speed is None or found.bf16_speed > 0.0
    assert isa.linear_path("bfloat16", found) == ("onednn-bf16" if found.native_pays("bf16") else "fp32-over-bf16")


def test_the_probe_agrees_with_torch_on_this_machine() -> None:
    found = isa.features()
    assert found.onednn_bf16 == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert found.aten_capability == torch.backends.cpu.get_cpu_capability()
    if LOWERED:
        assert (found.onednn_bf16, found.aten_capability) == (False, "AVX2")
        assert isa.linear_path("bfloat16") == "fp32-over-bf16"


@pytest.fixture
def widened(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a CPU without oneDNN 16-bit paths (an AVX2 CPU), whatever this one has."""
    monkeypatch.setattr(isa, "features", lambda: _features(False, ZEN3))


@pytest.mark.skipif(not packed_linear.available(), reason="this torch has no oneDNN")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_a_16_bit_layer_computes_in_fp32_where_onednn_has_no_path(widened: None, dtype: Any, bias: bool) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(80, 96, bias=bias).to(dtype)
    packed = PackedLinear(layer)
    assert packed.packed is not None and packed.packed.dtype == torch.float32
    x = torch.randn(37, 80).to(dtype)
    got = packed(x)
    want = torch.nn.functional.linear(x.float(), layer.weight.float(),
                                      None if layer.bias is None else layer.bias.float())
    assert got.dtype == dtype and got.shape == want.shape
    # fp32 products and sums, one rounding: within one 16-bit step of the fp32 result
    step = (want.abs() * (2 ** -7 if dtype == torch.bfloat16 else 2 ** -10)).clamp_min(1e-6)
    assert bool(((got.float() - want).abs() <= step).all())
    for rows in (1, 2, 5):  # a row's bits do not depend on its batch
        assert torch.equal(packed(x[:rows]), got[:rows])


@pytest.mark.skipif(not packed_linear.available(), reason="this torch has no oneDNN")
def test_a_bf16_engine_where_onednn_has_no_bf16_equals_generate_on_the_same_layers(
        widened: None, tiny_dir: Path) -> None:
    from engine_runs import engine_tokens, generate_tokens
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from djl_handlers.engines.hf.cpu.linear import prepack_linears, unpack_linears

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.bfloat16).eval()
    assert prepack_linears(model) > 0
    prompts = [tok.encode(p) for p in ("Hello there", "The capital of France is a city that", "x")]
    news = [6, 5, 7]
    try:
        got = engine_tokens(model, tok, prompts, news)
        assert [got[i][:n] for i, n in enumerate(news)] == generate_tokens(model, prompts, news)
    finally:
        unpack_linears(model)


# The tests whose paths differ at the AVX2 level (oneDNN without bf16, torch's 8-lane sums, the C
# kernels without AVX-512); the real-model engine runs of the linear and fused files are left to the
# native run (a minute each, the same code as their tiny-model runs).
LOWER_ISA_TESTS = ("tests/unit/test_cpu_isa.py", "tests/unit/test_hf_cpu_linear.py", "tests/unit/test_hf_cpu_fused.py",
                   "tests/unit/test_hf_cpu_mkl_linear.py",
                   "tests/unit/test_hf_cpu_norm.py", "tests/unit/test_hf_cpu_rotary.py", "tests/unit/test_row_stats.py",
                   "tests/unit/test_cpu_patches.py", "tests/unit/test_hf_cpu_int8.py",
                   "tests/unit/test_kernel_int8_gemm.py",
                   "tests/unit/test_hf_architectures.py::test_each_applied_patch_gives_the_modules_own_bits_on_a_real_"
                   "forwards_inputs",
                   "tests/unit/test_hf_dtype_agreement.py::test_16_bit_greedy_agrees_with_fp32_where_fp32_is_decided[bf16]")


def _natively_avx2() -> bool:
    """Whether this CPU itself tops out at AVX2 (the native run already is the lower level)."""
    return isa.isa_level(platform.machine(), isa.cpu_flags()[1]) in ("avx2", "baseline")


@pytest.mark.skipif(LOWERED, reason="already the lower ISA level")
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 ISA levels")
@pytest.mark.skipif(_natively_avx2(), reason="this CPU has no AVX-512: the native run is the AVX2 level")
def test_the_cpu_paths_pass_again_at_the_avx2_level(tmp_path: Path) -> None:
    """The lower ISA path runs in every CI run: the CPU tests again with AVX-512 and oneDNN bf16 off."""
    env = dict(os.environ, **LOWER_ISA, DJL_HANDLERS_KERNEL_DIR=str(tmp_path / "kernels"), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                           "-m", "not gpu", "-k", "not real_model", *LOWER_ISA_TESTS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and " failed" not in done.stdout, tail
    built = sorted(p.name for p in (tmp_path / "kernels").glob("*.so"))
    assert built, "no C kernel was built at the lower ISA level: " + tail
