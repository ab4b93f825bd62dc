"""The int8 GEMM kernel (kernels/int8_gemm.py): exact bits, rows independent, the same bits on
every instruction path."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.hf.cpu import isa  # noqa: E402
from djl_handlers.engines.hf.cpu.int8 import quantize_weight  # noqa: E402
from djl_handlers.kernels import int8_gemm as kernel  # noqa: E402

pytestmark = pytest.mark.skipif(not kernel.available(), reason=f"kernel not built: {kernel.unavailable_reason()}")
ROOT = Path(__file__).resolve().parents[2]


def _case(out: int, inp: int, rows: int, seed: int, bias: bool = True) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(seed)
    q, scales = quantize_weight(torch.randn(out, inp, generator=gen))
    x = torch.randn(rows, inp, generator=gen)
    if rows > 2:
        x[2] *= 80.0  # a row with a far larger range than its neighbours
    b = torch.randn(out, generator=gen) if bias else None
    return q, scales, x, b


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("out", "inp", "rows"), [(1, 1, 1), (16, 4, 3), (17, 7, 9), (40, 36, 14), (96, 80, 37),
                                                  (200, 161, 33), (3072, 576, 1), (576, 1536, 5), (960, 576, 64)])
def test_the_kernel_gives_the_references_bits(out: int, inp: int, rows: int, bias: bool) -> None:
    q, scales, x, b = _case(out, inp, rows, seed=out * inp + rows, bias=bias)
    packed = kernel.pack(q, scales)
    assert packed is not None
    got = kernel.gemm(x, packed, b)
    assert got is not None and got.shape == (rows, out) and got.dtype == torch.float32
    assert torch.equal(got, kernel.reference(x, q, scales, b))
    fp32 = x @ (q.float() * scales[:, None]).t() + (0 if b is None else b)
    assert float((got - fp32).norm() / fp32.norm()) < 0.02  # the activations' rounding only


def test_a_row_gets_the_same_bits_alone_in_any_batch_and_at_any_row_stride() -> None:
    q, scales, x, b = _case(300, 200, 41, seed=1)
    packed = kernel.pack(q, scales)
    assert packed is not None
    whole = kernel.gemm(x, packed, b)
    assert whole is not None
    for i in range(41):
        assert torch.equal(kernel.gemm(x[i:i + 1], packed, b), whole[i:i + 1])
    for start, stop in ((0, 4), (3, 20), (5, 41), (40, 41)):
        assert torch.equal(kernel.gemm(x[start:stop], packed, b), whole[start:stop])
    wide = torch.zeros(41, 260)
    wide[:, 30:230] = x
    strided = wide[:, 30:230]  # rows 260 floats apart
    assert strided.stride(0) == 260
    assert torch.equal(kernel.gemm(strided, packed, b), whole)


def test_the_largest_products_sum_exactly_without_saturating() -> None:
    """Every weight at +-127 and every activation at its row's peak: the pairs a 16-bit kernel would
    saturate (AVX2's vpmaddubsw on unsigned activations) must still sum exactly."""
    inp = 512
    q = torch.full((4, inp), 127, dtype=torch.int8)
    q[1] = -127
    q[2, ::2] = -127
    q[3] = torch.where(torch.arange(inp) % 3 == 0, -127, 127).to(torch.int8)
    scales = torch.ones(4)
    x = torch.stack([torch.ones(inp), -torch.ones(inp), torch.ones(inp).index_fill(0, torch.arange(0, inp, 2), -1.0)])
    packed = kernel.pack(q, scales)
    got = kernel.gemm(x, packed)
    assert got is not None
    want = (x.double() * 127) @ q.double().t() / 127  # scale 1/127 per activation, 1 per weight
    assert torch.equal(got.double(), want), (got, want)


def test_zero_rows_give_the_bias_and_a_nan_row_harms_no_neighbour() -> None:
    q, scales, x, b = _case(40, 24, 5, seed=3)
    x[1] = 0.0
    x[3, 7] = float("nan")
    packed = kernel.pack(q, scales)
    got = kernel.gemm(x, packed, b)
    assert got is not None
    assert torch.equal(got[1], b)
    assert bool(torch.isnan(got[3]).all())
    for i in (0, 2, 4):
        assert torch.equal(got[i:i + 1], kernel.gemm(x[i:i + 1], packed, b))
    assert kernel.gemm(torch.empty(0, 24), packed, b).shape == (0, 40)


def test_the_path_names_this_cpus_best() -> None:
    path = kernel.path()
    assert path in kernel.PATHS.values()
    flags = set(isa.cpu_flags()[1])
    if platform.machine() in ("x86_64", "AMD64") and not os.environ.get("DJL_HANDLERS_KERNEL_MARCH"):
        want = ("AVX-512 VNNI" if {"avx512_vnni", "avx512bw"} <= flags
                else "AVX-VNNI" if "avx_vnni" in flags else "AVX2" if "avx2" in flags else "portable C")
        assert path == want


_PROBE = """
import json, sys, torch
from djl_handlers.engines.hf.cpu.int8 import quantize_weight
from djl_handlers.kernels import int8_gemm as kernel
gen = torch.Generator().manual_seed(7)
q, scales = quantize_weight(torch.randn(333, 517, generator=gen))
x = torch.randn(21, 517, generator=gen) * torch.linspace(0.01, 30, 21)[:, None]
out = kernel.gemm(x, kernel.pack(q, scales), torch.randn(333, generator=gen))
json.dump({"path": kernel.path(), "bits": out.view(torch.int32).flatten().tolist()}, open(sys.argv[1], "w"))
"""

# the x86-64 targets that select each path (where this CPU runs them), the portable C one last
_TARGETS = {"AVX-512 VNNI": "native", "AVX-VNNI": "alderlake", "AVX2": "x86-64-v3", "portable C": "x86-64-v2"}


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 instruction paths")
def test_every_instruction_path_gives_the_same_bits(tmp_path: Path) -> None:
    flags = set(isa.cpu_flags()[1])
    runnable = {"AVX-512 VNNI": {"avx512_vnni", "avx512bw"} <= flags, "AVX-VNNI": "avx_vnni" in flags,
                "AVX2": "avx2" in flags, "portable C": True}
    results = {}
    for path, march in _TARGETS.items():
        if not runnable[path]:
            continue
        env = {**os.environ, "DJL_HANDLERS_KERNEL_DIR": str(tmp_path / "kernels"), "DJL_HANDLERS_KERNEL_MARCH": march}
        if march == "native":
            env.pop("DJL_HANDLERS_KERNEL_MARCH")
        out = tmp_path / f"{len(results)}.json"
        subprocess.run([sys.executable, "-c", _PROBE, str(out)], cwd=ROOT, env=env, check=True, timeout=300)
        found = json.loads(out.read_text())
        if march != "native":
            assert found["path"] == path, (march, found["path"])
        results[found["path"]] = found["bits"]
    assert len(results) >= 2, results.keys()
    first = next(iter(results.values()))
    assert all(bits == first for bits in results.values()), list(results)
