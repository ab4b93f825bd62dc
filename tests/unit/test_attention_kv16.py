"""A 16-bit key/value cache under an fp32 query (kernels/decode_attention.*): fp16 or bf16 keys and
values, fp32 arithmetic, an fp32 output. test_ragged_attention.py runs this file again on a library
built for each lower x86 level, so every path of the kernel (vector and plain C) is covered."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.kernels import build  # noqa: E402
from djl_handlers.kernels import decode_attention as kernel  # noqa: E402

needs_kernel = pytest.mark.skipif(not kernel.available(), reason=f"kernel unavailable: {kernel.unavailable_reason()}")

Tensor = Any
KV16 = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]
# 64: the vector path where the build has one; 40: always the plain C path; 128: a second vector shape
DIMS = [64, 40, 128]


def _inputs(rows: int, heads: int, kv_heads: int, queries: int, width: int, dim: int, kv_dtype: Any,
            seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """fp32 query [rows, heads, queries, dim] (HF's transposed view), 16-bit key/value
    [rows, kv_heads, width, dim] as views into bigger slabs, and starts with one unpadded row and
    (with two rows or more) one holding only its last column."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(rows, queries, heads, dim, generator=gen).transpose(1, 2)
    big = (rows + 2, kv_heads, width + 9, dim)
    key = torch.randn(*big, generator=gen).to(kv_dtype)[1 : rows + 1, :, 3 : width + 3]
    value = torch.randn(*big, generator=gen).to(kv_dtype)[:rows, :, 5 : width + 5]
    starts = torch.randint(0, width, (rows,), generator=gen)
    starts[0] = 0
    if rows > 1:
        starts[-1] = width - 1
    return query, key, value, starts


def _reference(query: Tensor, key: Tensor, value: Tensor, starts: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """fp64 causal attention over each row's columns [start, own column], the 16-bit keys and values
    upcast; returns ([B, Q, H, D], [B, Q] bool: the query is a real token, not padding)."""
    rows, heads, queries, _ = query.shape
    width, group = key.shape[2], heads // key.shape[1]
    keys = key.double().repeat_interleave(group, 1)
    values = value.double().repeat_interleave(group, 1)
    columns = torch.arange(width)
    position = width - queries + torch.arange(queries)
    mask = (columns[None, None, :] >= starts[:, None, None]) & (columns[None, None, :] <= position[None, :, None])
    scores = (query.double() @ keys.transpose(-1, -2) * scale).masked_fill(~mask[:, None], float("-inf"))
    out = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ values
    return out.transpose(1, 2), position[None, :] >= starts[:, None]


def _check(query: Tensor, key: Tensor, value: Tensor, starts: Tensor, scale: float) -> Tensor:
    got = kernel.attention(query, key, value, starts, scale)
    rows, heads, queries, dim = query.shape
    assert got is not None
    assert got.shape == (rows, queries, heads, dim) and got.dtype == torch.float32 and got.is_contiguous()
    expected, real = _reference(query, key, value, starts, scale)
    assert torch.allclose(got.double()[real], expected[real], rtol=1e-5, atol=1e-5), \
        (got.double() - expected)[real].abs().max()
    assert bool((got[~real] == 0).all()), "a padding query gets zeros"
    return got


# ---------------------------------------------------------------------------------------------
# 1. the result: fp64 attention over the upcast cache


@needs_kernel
@pytest.mark.parametrize("kv_dtype", KV16)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4), (16, 1)])
@pytest.mark.parametrize(("rows", "width"), [(5, 19), (1, 1), (3, 70)])
def test_decode_over_a_16_bit_cache(kv_dtype: Any, dim: int, heads: int, kv_heads: int, rows: int,
                                    width: int) -> None:
    query, key, value, starts = _inputs(rows, heads, kv_heads, 1, width, dim, kv_dtype, seed=rows * 100 + width)
    got = kernel.decode_attention(query[:, :, 0], key, value, starts, dim**-0.5)
    assert got is not None and got.shape == (rows, heads, dim) and got.dtype == torch.float32
    expected = _reference(query, key, value, starts, dim**-0.5)[0][:, 0]
    assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-5), (got.double() - expected).abs().max()


@needs_kernel
@pytest.mark.parametrize("kv_dtype", KV16)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (8, 2)])
@pytest.mark.parametrize(("rows", "queries", "width"), [(1, 5, 5), (3, 17, 17), (2, 40, 60), (4, 6, 20)])
def test_prefill_over_a_16_bit_cache_is_causal_with_left_padding(kv_dtype: Any, dim: int, heads: int, kv_heads: int,
                                                                rows: int, queries: int, width: int) -> None:
    _check(*_inputs(rows, heads, kv_heads, queries, width, dim, kv_dtype, seed=rows * 100 + queries),
           dim**-0.5)


@needs_kernel
@pytest.mark.parametrize("kv_dtype", KV16)
@pytest.mark.parametrize("dim", DIMS)
def test_a_16_bit_cache_gives_the_bits_of_its_fp32_upcast(kv_dtype: Any, dim: int) -> None:
    """The 16-bit keys and values are converted to fp32 exactly and then go through the fp32
    arithmetic of an fp32 cache: the same bits as the cache upcast to fp32."""
    for queries, width in ((1, 37), (9, 40)):
        query, key, value, starts = _inputs(4, 9, 3, queries, width, dim, kv_dtype, seed=queries)
        got = kernel.attention(query, key, value, starts, dim**-0.5)
        upcast = kernel.attention(query, key.float(), value.float(), starts, dim**-0.5)
        assert got is not None and upcast is not None and torch.equal(got, upcast)


@needs_kernel
@pytest.mark.parametrize("kv_dtype", KV16)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("queries", [1, 7])
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(kv_dtype: Any, dim: int, queries: int) -> None:
    rows, width = 9, 30
    query, key, value, starts = _inputs(rows, 9, 3, queries, width, dim, kv_dtype, seed=dim)
    whole = kernel.attention(query, key, value, starts, dim**-0.5)
    assert whole is not None
    for b in range(rows):  # alone, in fresh (differently aligned) memory
        alone = kernel.attention(query[b : b + 1].clone(), key[b : b + 1].clone(), value[b : b + 1].clone(),
                                 starts[b : b + 1], dim**-0.5)
        assert alone is not None and torch.equal(alone, whole[b : b + 1]), f"row {b}"
    for lo, hi in ((0, 1), (2, 5), (4, 9)):  # sub-batches: views of the same slabs
        part = kernel.attention(query[lo:hi], key[lo:hi], value[lo:hi], starts[lo:hi], dim**-0.5)
        assert part is not None and torch.equal(part, whole[lo:hi]), (lo, hi)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = kernel.attention(query, key, value, starts, dim**-0.5)
    finally:
        torch.set_num_threads(before)
    assert single is not None and torch.equal(single, whole), "the thread count changed the bits"


# ---------------------------------------------------------------------------------------------
# 2. the 16-bit -> fp32 conversion: every bit pattern, subnormals, large values


def _every_pattern(kv_dtype: Any, dim: int) -> Tensor:
    """All 65536 16-bit patterns as ``kv_dtype`` (padded by repeating to a multiple of ``dim``),
    shaped [rows, 1, 1, dim]."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    bits = torch.cat([bits, bits[: (-bits.numel()) % dim]])
    return bits.view(kv_dtype).view(-1, 1, 1, dim)


@needs_kernel
@pytest.mark.parametrize("kv_dtype", KV16)
@pytest.mark.parametrize("dim", DIMS)
def test_every_16_bit_value_is_converted_exactly(kv_dtype: Any, dim: int) -> None:
    """One column per row: the output is 1.0 times that column's value, so it must be the value's
    exact fp32 (subnormals, the largest values, infinities and NaN included)."""
    value = _every_pattern(kv_dtype, dim)
    rows = value.shape[0]
    key = torch.zeros_like(value)
    query = torch.randn(rows, 2, 1, dim)
    got = kernel.attention(query, key, value, torch.zeros(rows, dtype=torch.int64), 0.125)
    assert got is not None
    expected = value.float().transpose(1, 2).expand(rows, 1, 2, dim)
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@needs_kernel
@pytest.mark.parametrize("dim", DIMS)
def test_fp16_subnormal_and_large_keys_and_values(dim: int) -> None:
    """Keys and values that are fp16 subnormals or near fp16's largest value (65504). Flushed
    subnormals or misread exponents move the result far outside the tolerance; the values are all
    positive so that no output is a cancellation near zero."""
    rows, heads, kv_heads, queries, width = 3, 6, 2, 4, 24
    gen = torch.Generator().manual_seed(dim)
    shape = (rows, kv_heads, width, dim)

    def subnormal(signed: bool) -> Tensor:  # multiples 1..1023 of 2^-24, fp16's smallest subnormal
        sign = torch.randn(shape, generator=gen).sign() if signed else 1.0
        return (torch.randint(1, 1024, shape, generator=gen) * sign * 2.0**-24).half()

    def large() -> Tensor:
        return (torch.rand(shape, generator=gen) * 8000 + 57000).half()

    starts = torch.tensor([0, 5, 22])
    keys, values = subnormal(signed=True), large()
    assert bool((keys.abs() < 2.0**-14).all()) and bool((keys != 0).all())
    # subnormal keys under a large query: scores of order 1, all 0 if the subnormals were flushed
    query = torch.randn(rows, heads, queries, dim, generator=gen) * 3e4
    scores = query[:, :3] @ keys[:, :1].float().transpose(-1, -2) * dim**-0.5  # the heads of kv head 0
    assert scores.abs().mean() > 0.5
    _check(query, keys, values, starts, dim**-0.5)
    # large keys (signed) under a small query, subnormal values: outputs of fp16 subnormal size
    keys = large() * torch.randn(shape, generator=gen).sign().half()
    values = subnormal(signed=False)
    query = torch.randn(rows, heads, queries, dim, generator=gen) * 1e-4
    got = kernel.attention(query, keys, values, starts, dim**-0.5)
    expected, real = _reference(query, keys, values, starts, dim**-0.5)
    assert got is not None and bool((got[real] > 0).all())
    assert torch.allclose(got.double()[real], expected[real], rtol=1e-5, atol=0), \
        ((got.double() - expected)[real] / expected[real]).abs().max()


# ---------------------------------------------------------------------------------------------
# 3. refusals


@needs_kernel
@pytest.mark.parametrize(
    ("q_dtype", "k_dtype", "v_dtype"),
    [
        (torch.bfloat16, torch.float16, torch.float16),
        (torch.bfloat16, torch.float32, torch.float32),
        (torch.float16, torch.float16, torch.float16),
        (torch.float16, torch.float32, torch.float32),
        (torch.float32, torch.float16, torch.bfloat16),
        (torch.float32, torch.float16, torch.float32),
        (torch.float32, torch.float32, torch.bfloat16),
        (torch.float32, torch.float64, torch.float64),
    ],
)
def test_unsupported_dtype_combinations_are_refused(q_dtype: Any, k_dtype: Any, v_dtype: Any) -> None:
    query, key, value, starts = _inputs(3, 8, 2, 1, 10, 64, torch.float32)
    query, key, value = query.to(q_dtype), key.to(k_dtype), value.to(v_dtype)
    assert kernel.attention(query, key, value, starts, 0.125) is None
    assert kernel.decode_attention(query[:, :, 0], key, value, starts, 0.125) is None


@needs_kernel
def test_the_c_entry_point_refuses_unsupported_kinds() -> None:
    """The library checks the kind pair itself (0 fp32, 1 bf16, 2 fp16): -1, nothing written."""
    query, key, value, starts = _inputs(2, 4, 2, 1, 6, 64, torch.float16)
    out = torch.full((2, 1, 4, 64), 7.0)
    shape = kernel._Shape(2, 4, 2, 64, 6, *query.stride()[:2], *key.stride()[:3], *value.stride()[:3], 1,
                          query.stride(2), 0.125, 1)
    fn = kernel.library()
    for q_kind, kv_kind in ((1, 2), (1, 0), (2, 2), (2, 0), (0, 3), (3, 0), (-1, 0)):
        rc = fn(ctypes.byref(shape), q_kind, kv_kind, query.data_ptr(), key.data_ptr(), value.data_ptr(),
                starts.data_ptr(), out.data_ptr())
        assert rc == -1, (q_kind, kv_kind)
    assert bool((out == 7.0).all())


# ---------------------------------------------------------------------------------------------
# 4. the other builds of the same source: the plain C path vectorised for this CPU, and an AVX2
# build without F16C (its fp16 keys and values go to the plain C path)


@needs_kernel
@pytest.mark.skipif(os.environ.get("DJL_HANDLERS_KERNEL_MARCH") is not None, reason="already a capped build")
@pytest.mark.parametrize("flags", [pytest.param(("-DDJL_PLAIN_C",), id="plain-C"),
                                   pytest.param(("-mno-f16c",), id="no-f16c")])
def test_other_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flags: tuple[str, ...]) -> None:
    if flags == ("-mno-f16c",) and os.uname().machine != "x86_64":
        pytest.skip("an x86 flag")
    monkeypatch.setenv("DJL_HANDLERS_KERNEL_DIR", str(tmp_path / "kernels"))
    native = kernel.library()
    fn = build._build_and_load(kernel.NAME, flags).djl_decode_attention
    fn.argtypes, fn.restype = native.argtypes, native.restype
    monkeypatch.setattr(kernel, "_fn", fn)
    for kv_dtype in (torch.float16, torch.bfloat16):
        for dim in (64, 40):
            _check(*_inputs(3, 9, 3, 6, 20, dim, kv_dtype, seed=dim), dim**-0.5)
            test_every_16_bit_value_is_converted_exactly(kv_dtype, dim)
    test_fp16_subnormal_and_large_keys_and_values(64)
