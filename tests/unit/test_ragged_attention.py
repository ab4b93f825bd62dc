"""``option.cpu_attention``: decode attention over each row's real tokens only (kernels/decode_attention.*,
engines/hf/cpu/ragged_attention.py, the loader's switch, kernels/build.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_runs import engine_tokens, generate_tokens  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from djl_handlers.engines.hf.cpu import ragged_attention  # noqa: E402
from djl_handlers.engines.hf.cpu.linear import prepack_linears, unpack_linears  # noqa: E402
from djl_handlers.engines.hf.cpu.ragged_attention import ATTN_NAME, disable, enable, starts_from_mask  # noqa: E402
from djl_handlers.engines.hf.engine import HFEngine  # noqa: E402
from djl_handlers.errors import ConfigError  # noqa: E402
from djl_handlers.kernels import build  # noqa: E402
from djl_handlers.kernels import decode_attention as kernel  # noqa: E402

pytest_plugins = ["conftest_models"]
needs_kernel = pytest.mark.skipif(not kernel.available(), reason=f"kernel unavailable: {kernel.unavailable_reason()}")

Tensor = Any


# ---------------------------------------------------------------------------------------------
# helpers


def _inputs(rows: int, heads: int, kv_heads: int, width: int, dim: int, dtype: Any, seed: int = 0,
            slab: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """query [rows, heads, dim] as HF passes it (a [B, 1, H, D] tensor transposed, column 0 taken);
    key/value [rows, kv_heads, width, dim] as views into a bigger slab (spare rows and columns on
    both sides, like engines/hf/batch.py's SlabLayer) or contiguous."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(rows, 1, heads, dim, generator=gen).to(dtype).transpose(1, 2)[:, :, 0]
    if not slab:
        key = torch.randn(rows, kv_heads, width, dim, generator=gen).to(dtype)
        value = torch.randn(rows, kv_heads, width, dim, generator=gen).to(dtype)
        return query, key, value
    big = (rows + 3, kv_heads, width + 7, dim)
    key = torch.randn(*big, generator=gen).to(dtype)[1 : rows + 1, :, 3 : width + 3]
    value = torch.randn(*big, generator=gen).to(dtype)[2 : rows + 2, :, 4 : width + 4]
    return query, key, value


def _random_starts(rows: int, width: int, seed: int = 0) -> Tensor:
    gen = torch.Generator().manual_seed(seed + 1)
    starts = torch.randint(0, width, (rows,), generator=gen)
    starts[0] = 0  # at least one row without padding, and one with a single column
    starts[-1] = width - 1
    return starts


def _reference(query: Tensor, key: Tensor, value: Tensor, starts: Tensor, scale: float) -> Tensor:
    """torch's SDPA in fp64 with the boolean "padding then tokens" mask; [rows, heads, dim]."""
    rows, heads, _ = query.shape
    width = key.shape[2]
    mask = (torch.arange(width)[None, :] >= starts[:, None])[:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        query[:, :, None].double(), key.double(), value.double(), attn_mask=mask, scale=scale,
        enable_gqa=heads != key.shape[1])
    return out[:, :, 0]


def _check(rows: int, heads: int, kv_heads: int, width: int, dim: int, dtype: Any, seed: int = 0,
           slab: bool = True) -> None:
    query, key, value = _inputs(rows, heads, kv_heads, width, dim, dtype, seed, slab)
    starts = _random_starts(rows, width, seed)
    scale = dim**-0.5
    got = kernel.decode_attention(query, key, value, starts, scale)
    assert got is not None
    assert got.shape == (rows, heads, dim) and got.dtype == dtype and got.is_contiguous()
    expected = _reference(query, key, value, starts, scale)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.double(), expected, rtol=tol, atol=tol), (got.double() - expected).abs().max()


# ---------------------------------------------------------------------------------------------
# 1. the kernel computes SDPA over [start, T)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2), (12, 4), (8, 2), (3, 1), (16, 1)])
@pytest.mark.parametrize("dim", [64, 128, 80, 32, 256])
def test_kernel_equals_sdpa_with_the_padding_mask(dtype: Any, heads: int, kv_heads: int, dim: int) -> None:
    _check(5, heads, kv_heads, 19, dim, dtype)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "width"), [(1, 1), (1, 2), (2, 1), (3, 7), (17, 33), (33, 65), (33, 3)])
@pytest.mark.parametrize("slab", [True, False])
def test_kernel_over_rows_and_widths(dtype: Any, rows: int, width: int, slab: bool) -> None:
    _check(rows, 9, 3, width, 64, dtype, seed=rows * 100 + width, slab=slab)


@needs_kernel
def test_kernel_without_padding_and_with_a_single_column_per_row() -> None:
    query, key, value = _inputs(4, 8, 2, 10, 64, torch.float32)
    for starts in (torch.zeros(4, dtype=torch.int64), torch.full((4,), 9, dtype=torch.int64)):
        got = kernel.decode_attention(query, key, value, starts, 0.125)
        assert got is not None
        assert torch.allclose(got.double(), _reference(query, key, value, starts, 0.125), rtol=1e-5, atol=1e-5)
    # one column: the softmax is 1, so the output is that column's value, repeated over each group
    got = kernel.decode_attention(query, key, value, torch.full((4,), 9, dtype=torch.int64), 0.125)
    assert got is not None
    assert torch.allclose(got, value[:, :, 9].repeat_interleave(4, dim=1), rtol=1e-6, atol=1e-6)


@needs_kernel
def test_padding_is_never_read() -> None:
    """Columns before a row's start (NaN here) do not reach its output."""
    query, key, value = _inputs(3, 4, 2, 12, 64, torch.float32)
    starts = torch.tensor([0, 5, 11])
    clean = kernel.decode_attention(query, key, value, starts, 0.125)
    for b, start in enumerate(starts.tolist()):
        key[b, :, :start] = float("nan")
        value[b, :, :start] = float("inf")
    poisoned = kernel.decode_attention(query, key, value, starts, 0.125)
    assert clean is not None and poisoned is not None
    assert torch.equal(clean, poisoned)


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 9), kv_heads=st.integers(1, 4), group=st.sampled_from([1, 2, 3, 4, 7, 16]),
    width=st.integers(1, 40), dim=st.sampled_from([1, 8, 48, 64, 80, 96, 128]),
    bf16=st.booleans(), slab=st.booleans(), seed=st.integers(0, 2**16),
)
def test_kernel_property(rows: int, kv_heads: int, group: int, width: int, dim: int, bf16: bool, slab: bool,
                         seed: int) -> None:
    _check(rows, kv_heads * group, kv_heads, width, dim, torch.bfloat16 if bf16 else torch.float32, seed, slab)


# ---------------------------------------------------------------------------------------------
# 2. batch invariance: the same bits alone and in any batch


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 80), (8, 2, 128)])
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(dtype: Any, heads: int, kv_heads: int, dim: int) -> None:
    rows, width = 33, 41
    query, key, value = _inputs(rows, heads, kv_heads, width, dim, dtype)
    starts = _random_starts(rows, width)
    whole = kernel.decode_attention(query, key, value, starts, dim**-0.5)
    assert whole is not None
    for b in range(rows):  # alone, in fresh (differently aligned) memory
        alone = kernel.decode_attention(query[b : b + 1].clone(), key[b : b + 1].clone(), value[b : b + 1].clone(),
                                        starts[b : b + 1], dim**-0.5)
        assert alone is not None and torch.equal(alone, whole[b : b + 1]), f"row {b}"
    for lo, hi in ((0, 1), (3, 5), (0, 16), (10, 33), (31, 33)):  # sub-batches: views of the same slab
        part = kernel.decode_attention(query[lo:hi], key[lo:hi], value[lo:hi], starts[lo:hi], dim**-0.5)
        assert part is not None and torch.equal(part, whole[lo:hi]), (lo, hi)
    # the same row inside a batch of other rows, one element off the original alignment
    other_q, other_k, other_v = _inputs(6, heads, kv_heads, width + 1, dim, dtype, seed=7)
    other_k[2, :, 1:], other_v[2, :, 1:] = key[4], value[4]
    other_q[2] = query[4]
    other_starts = torch.tensor([0, 3, int(starts[4]) + 1, 9, 40, 1])
    mixed = kernel.decode_attention(other_q, other_k, other_v, other_starts, dim**-0.5)
    assert mixed is not None and torch.equal(mixed[2], whole[4])


@needs_kernel
def test_the_thread_count_does_not_change_the_bits() -> None:
    query, key, value = _inputs(7, 12, 4, 30, 64, torch.float32)
    starts = _random_starts(7, 30)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(kernel.decode_attention(query, key, value, starts, 0.125))
    finally:
        torch.set_num_threads(before)
    assert results[0] is not None and results[1] is not None and torch.equal(results[0], results[1])


# ---------------------------------------------------------------------------------------------
# 3. refusals: None, never a crash


def _good() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    query, key, value = _inputs(3, 8, 2, 10, 64, torch.float32)
    return query, key, value, torch.tensor([0, 4, 9])


@needs_kernel
@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda q, k, v, s: (q.half(), k.half(), v.half(), s), id="fp16"),
        pytest.param(lambda q, k, v, s: (q.double(), k.double(), v.double(), s), id="float64"),
        pytest.param(lambda q, k, v, s: (q, k.bfloat16(), v, s), id="mixed-dtypes"),
        pytest.param(lambda q, k, v, s: (q, k.transpose(2, 3).contiguous().transpose(2, 3), v, s),
                     id="key-last-dim-strided"),
        pytest.param(lambda q, k, v, s: (q.transpose(1, 2).contiguous().transpose(1, 2), k, v, s),
                     id="query-last-dim-strided"),
        pytest.param(lambda q, k, v, s: (q, k, v[:, :, :-1], s), id="value-shape"),
        pytest.param(lambda q, k, v, s: (q, k[:2], v[:2], s), id="key-rows"),
        pytest.param(lambda q, k, v, s: (q[..., :32], k, v, s), id="query-dim"),
        pytest.param(lambda q, k, v, s: (q[:, None], k, v, s), id="query-4d"),
        pytest.param(lambda q, k, v, s: (q[:, :7], k, v, s), id="heads-not-a-multiple"),
        pytest.param(lambda q, k, v, s: (q, k[:, :0], v[:, :0], s), id="zero-kv-heads"),
        pytest.param(lambda q, k, v, s: (q, k, v, s.int()), id="starts-int32"),
        pytest.param(lambda q, k, v, s: (q, k, v, s.float()), id="starts-float"),
        pytest.param(lambda q, k, v, s: (q, k, v, s[:2]), id="starts-short"),
        pytest.param(lambda q, k, v, s: (q, k, v, s[:, None]), id="starts-2d"),
        pytest.param(lambda q, k, v, s: (q, k, v, torch.tensor([0, -1, 3])), id="start-negative"),
        pytest.param(lambda q, k, v, s: (q, k, v, torch.tensor([0, 10, 3])), id="start-at-width"),
        pytest.param(lambda q, k, v, s: (q, k, v, torch.tensor([0, 1 << 40, 3])), id="start-huge"),
        pytest.param(lambda q, k, v, s: (q, k[:, :, :0], v[:, :, :0], s * 0), id="no-columns"),
        pytest.param(lambda q, k, v, s: (torch.randn(3, 34, 64), k[:, :1], v[:, :1], s), id="group-over-16"),
        pytest.param(lambda q, k, v, s: (torch.randn(3, 2, 640), torch.randn(3, 2, 10, 640),
                                         torch.randn(3, 2, 10, 640), s), id="dim-over-512"),
    ],
)
def test_unsupported_inputs_are_refused_with_none(change: Any) -> None:
    query, key, value, starts = change(*_good())
    assert kernel.decode_attention(query, key, value, starts, 0.125) is None


@needs_kernel
def test_accepted_edge_inputs() -> None:
    query, key, value, starts = _good()
    # non-contiguous starts (every other element of a longer tensor) are copied, not misread
    spread = torch.tensor([0, 99, 4, 99, 9, 99])[::2]
    got = kernel.decode_attention(query, key, value, spread, 0.125)
    assert got is not None and torch.equal(got, kernel.decode_attention(query, key, value, starts, 0.125))
    empty = kernel.decode_attention(query[:0], key[:0], value[:0], starts[:0], 0.125)
    assert empty is not None and empty.shape == (0, 8, 64)
    # the largest supported group and head dim still compute the right thing
    _check(2, 16, 1, 5, 512, torch.float32)


# ---------------------------------------------------------------------------------------------
# 4. starts from the boolean SDPA mask


def _mask(rows: list[list[int]]) -> Tensor:
    return torch.tensor(rows, dtype=torch.bool)[:, None, None, :]


def test_starts_from_mask() -> None:
    assert torch.equal(starts_from_mask(None, 3, 5), torch.zeros(3, dtype=torch.int64))
    starts = starts_from_mask(_mask([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]]), 3, 5)
    assert starts is not None and starts.tolist() == [2, 0, 4] and starts.dtype == torch.int64
    assert starts_from_mask(_mask([[0, 1, 0, 1, 1]]), 1, 5) is None  # a hole
    assert starts_from_mask(_mask([[1, 1, 1, 0, 0]]), 1, 5) is None  # right padding
    assert starts_from_mask(_mask([[1, 1, 1], [0, 0, 0]]), 2, 3) is None  # a row with nothing to attend to
    assert starts_from_mask(_mask([[1, 1, 1]]).float(), 1, 3) is None  # an additive float mask
    assert starts_from_mask(_mask([[1, 1, 1]]), 1, 4) is None  # not this call's shape
    assert starts_from_mask(torch.ones(1, 1, 2, 3, dtype=torch.bool), 1, 3) is None  # several queries


def test_the_starts_cache_follows_the_mask_object() -> None:
    first = _mask([[0, 1, 1], [1, 1, 1]])
    starts = starts_from_mask(first, 2, 3)
    assert starts is not None and starts.tolist() == [1, 0]
    assert starts_from_mask(first, 2, 3) is starts  # the other layers of the same forward
    second = _mask([[1, 1, 1], [0, 0, 1]])  # a new forward, while the old mask is alive
    again = starts_from_mask(second, 2, 3)
    assert again is not None and again.tolist() == [0, 2]
    assert starts_from_mask(_mask([[0, 1, 0], [1, 1, 1]]), 2, 3) is None
    del first, second
    for row in ([0, 0, 1], [1, 1, 1], [0, 1, 1]):  # freed masks: new objects may reuse their memory
        got = starts_from_mask(_mask([row, [1, 1, 1]]), 2, 3)
        assert got is not None and got.tolist() == [row.index(1), 0]


# ---------------------------------------------------------------------------------------------
# 5. through a real model: the engine, generate() with the kernel, generate() with stock SDPA


@needs_kernel
@pytest.mark.parametrize("fixture", ["tiny_model", pytest.param("real_model", marks=pytest.mark.slow)])
def test_engine_with_ragged_attention_equals_generate_alone_and_stock_sdpa(
    fixture: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tok = request.getfixturevalue(fixture)
    prompts = [tok.encode(p) for p in ("Hello there", "The capital of France is a city that", "x",
                                       "One two three four five six seven eight nine ten eleven twelve")]
    news = [7, 5, 9, 6]
    kernel_calls: list[tuple[int, int]] = []  # (rows, queries) of every kernel call
    fallback_queries: list[int] = []
    real_kernel, real_sdpa = kernel.attention, ragged_attention._sdpa

    def counting_kernel(query: Tensor, *args: Any) -> Tensor | None:
        out = real_kernel(query, *args)
        assert out is not None, "the kernel refused a step of a real model"
        kernel_calls.append((query.shape[0], query.shape[2]))
        return out

    def counting_sdpa(module: Any, query: Tensor, *args: Any, **kwargs: Any) -> Any:
        fallback_queries.append(query.shape[2])
        return real_sdpa(module, query, *args, **kwargs)

    monkeypatch.setattr(kernel, "attention", counting_kernel)
    monkeypatch.setattr(ragged_attention, "_sdpa", counting_sdpa)
    assert model.config._attn_implementation == "sdpa"
    assert prepack_linears(model) > 0
    try:
        assert enable(model) and model.config._attn_implementation == ATTN_NAME
        got = engine_tokens(model, tok, prompts, news)
        layers = model.config.num_hidden_layers
        assert max(r for r, q in kernel_calls if q == 1) > 1, "batched decode steps did not reach the kernel"
        assert max(q for _, q in kernel_calls) > 1, "prompts did not reach the kernel"
        assert not fallback_queries, "every step of a plain causal model goes to the kernel"
        engine_calls = len(kernel_calls)
        assert engine_calls % layers == 0
        alone = generate_tokens(model, prompts, news)
        # generate() alone: one prompt forward and n - 1 decode forwards per request, all in the kernel
        assert len(kernel_calls) - engine_calls == layers * sum(news)
        disable(model)
        assert model.config._attn_implementation == "sdpa"
        calls = len(kernel_calls)
        stock = generate_tokens(model, prompts, news)
        assert len(kernel_calls) == calls  # stock SDPA does not come here at all
    finally:
        disable(model)
        unpack_linears(model)
    for i, n in enumerate(news):
        assert got[i][:n] == alone[i], f"request {i}: engine vs generate() alone"
        assert alone[i] == stock[i], f"request {i}: ragged generate() vs stock sdpa"


@needs_kernel
def test_bf16_engine_with_ragged_attention_equals_generate_alone(tiny_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16: the kernel's own dtype path, through the engine's slab views and generate() alike."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.bfloat16).eval()
    dtypes: list[Any] = []
    real_kernel = kernel.attention

    def recording_kernel(query: Tensor, *args: Any) -> Tensor | None:
        dtypes.append(query.dtype)
        return real_kernel(query, *args)

    monkeypatch.setattr(kernel, "attention", recording_kernel)
    prompts = [tok.encode(p) for p in ("Hello there", "The capital of France is a city that", "x", "One two three")]
    news = [6, 4, 8, 5]
    assert enable(model)
    got = engine_tokens(model, tok, prompts, news)
    alone = generate_tokens(model, prompts, news)
    assert dtypes and set(dtypes) == {torch.bfloat16}
    for i, n in enumerate(news):
        assert got[i][:n] == alone[i], f"request {i}"


def test_enable_leaves_other_attentions_alone(tiny_model: Any) -> None:
    model, _ = tiny_model
    model.config._attn_implementation = "eager"
    try:
        assert not enable(model) and model.config._attn_implementation == "eager"
        disable(model)
        assert model.config._attn_implementation == "eager"
    finally:
        model.config._attn_implementation = "sdpa"


@needs_kernel
@pytest.mark.parametrize("required", [False, True])
def test_a_model_not_on_sdpa_keeps_its_attention_even_when_ragged_is_required(tiny_model: Any, required: bool) -> None:
    from djl_handlers.engines.hf.cpu.patches import use_ragged_attention

    model, _ = tiny_model
    model.config._attn_implementation = "eager"
    try:
        use_ragged_attention(model, required=required)  # the kernel builds: not an error
        assert model.config._attn_implementation == "eager"
    finally:
        model.config._attn_implementation = "sdpa"


# ---------------------------------------------------------------------------------------------
# 6. the loader's switch



def _engine(tiny_dir: Path, value: str | None) -> HFEngine:
    from djl_handlers.config.models import ServingConfig

    options = {"model_id": str(tiny_dir), "rolling_batch": "auto", "cpu_linear": "torch",
               **({"cpu_attention": value} if value else {})}
    return HFEngine.from_config(ServingConfig.from_properties(options, engine="huggingface"))


@needs_kernel
@pytest.mark.parametrize(("value", "attention"), [(None, ATTN_NAME), ("auto", ATTN_NAME), ("ragged", ATTN_NAME),
                                                   ("sdpa", "sdpa")])
def test_the_hf_engine_uses_ragged_attention_by_default_on_the_cpu(tiny_dir: Path, value: str | None,
                                                                   attention: str) -> None:
    assert _engine(tiny_dir, value).model.config._attn_implementation == attention


@pytest.fixture
def unbuildable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No compiler on the PATH, an empty kernel folder, and no library remembered by this process."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("DJL_HANDLERS_KERNEL_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(build, "_errors", {})
    monkeypatch.setattr(kernel, "_fn", None)


def test_an_unbuildable_kernel_keeps_sdpa_under_auto_and_fails_ragged(
    tiny_dir: Path, unbuildable: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        engine = _engine(tiny_dir, None)
    assert engine.model.config._attn_implementation == "sdpa"
    assert any("stays on torch's SDPA" in r.getMessage() and "no C compiler" in r.getMessage()
               for r in caplog.records), caplog.text
    with pytest.raises(ConfigError, match="cpu_attention=ragged.*no C compiler found") as info:
        _engine(tiny_dir, "ragged")
    assert info.value.field == "option.cpu_attention"
    assert kernel.decode_attention(*_good(), 0.125) is None  # the wrapper refuses too


# ---------------------------------------------------------------------------------------------
# 7. build.py


_compile_steps: list[list[str]] = []


def _compiles(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Records the link commands (one per library built); the compile commands go to _compile_steps."""
    calls: list[list[str]] = []
    real_run = subprocess.run
    _compile_steps.clear()

    def run(cmd: list[str], *args: Any, **kwargs: Any) -> Any:
        if "-shared" in cmd:
            calls.append(cmd)
        elif "-c" in cmd:
            _compile_steps.append(cmd)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(build.subprocess, "run", run)
    return calls


@needs_kernel
def test_the_library_is_built_once_into_the_cache_and_reused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    folder = tmp_path / "fresh" / "kernels"
    monkeypatch.setenv("DJL_HANDLERS_KERNEL_DIR", str(folder))
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(build, "_errors", {})
    compiles = _compiles(monkeypatch)
    assert build.load(kernel.NAME) is not None and build.error(kernel.NAME) is None
    (library,) = folder.iterdir()  # one library, no temporary or object files left behind
    assert library.name.startswith(f"{kernel.NAME}-") and library.suffix == ".so"
    assert len(compiles) == 1
    # -ffast-math only where the code is compiled, never where it is linked (crtfastmath.o)
    assert "-ffast-math" in _compile_steps[0] and "-ffast-math" not in compiles[0]
    mtime = library.stat().st_mtime_ns
    monkeypatch.setattr(build, "_loaded", {})  # a new process: same folder, nothing remembered
    assert build.load(kernel.NAME) is not None
    assert len(compiles) == 1 and [p.name for p in folder.iterdir()] == [library.name]
    assert library.stat().st_mtime_ns == mtime


def test_an_unwritable_cache_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DJL_HANDLERS_KERNEL_DIR", str(blocker / "kernels"))
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(build, "_errors", {})
    if build.compiler() is None:
        pytest.skip("no C compiler here")
    assert build.load(kernel.NAME) is None
    reason = build.error(kernel.NAME)
    assert reason is not None and f"cannot write to {blocker / 'kernels'}" in reason


def test_a_failing_compiler_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "broken-cc"
    fake.write_text("#!/bin/sh\necho 'broken-cc: no luck' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("DJL_HANDLERS_KERNEL_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(build, "_errors", {})
    assert build.load(kernel.NAME) is None
    reason = build.error(kernel.NAME)
    assert reason is not None and reason.count("broken-cc: no luck") == len(build.FLAG_SETS), reason
    assert not [p for p in (tmp_path / "kernels").iterdir()], "temporary files were left behind"
    assert os.environ["CC"] == str(fake)


@needs_kernel
def test_loading_the_library_leaves_subnormal_floats_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A library linked with -ffast-math (gcc < 13, clang) sets flush-to-zero for the whole process
    when it loads: torch's and numpy's subnormals would silently become 0 everywhere."""
    import numpy as np

    monkeypatch.setenv("DJL_HANDLERS_KERNEL_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(build, "_errors", {})
    assert build.load(kernel.NAME) is not None
    tiny = torch.tensor([1e-38], dtype=torch.float32)
    assert (tiny / 1000).item() > 0 and (tiny * 1e-3).item() > 0
    assert float(np.float32(1e-38) / np.float32(1000)) > 0


# ---------------------------------------------------------------- prompts: causal over the last Q columns
def _causal_reference(query: Tensor, key: Tensor, value: Tensor, starts: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """fp64 SDPA with the causal + padding mask; returns ([B, Q, H, D], [B, Q] bool: query is a real token)."""
    rows, heads, queries, _ = query.shape
    width = key.shape[2]
    columns = torch.arange(width)
    position = width - queries + torch.arange(queries)
    mask = (columns[None, None, :] >= starts[:, None, None]) & (columns[None, None, :] <= position[None, :, None])
    group = heads // key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key.double().repeat_interleave(group, 1), value.double().repeat_interleave(group, 1),
        attn_mask=mask[:, None], scale=scale)
    return out.transpose(1, 2), position[None, :] >= starts[:, None]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 64), (8, 2, 128), (6, 2, 48)])
@pytest.mark.parametrize(("rows", "queries", "width"), [(1, 5, 5), (3, 17, 17), (2, 40, 60), (2, 33, 33)])
def test_prompt_attention_is_causal_over_each_rows_tokens(dtype: Any, heads: int, kv_heads: int, dim: int,
                                                          rows: int, queries: int, width: int) -> None:
    torch.manual_seed(rows * 100 + queries)
    query = torch.randn(rows, queries, heads, dim, dtype=dtype).transpose(1, 2)  # HF's [B, H, Q, D] view
    key = torch.randn(rows + 2, kv_heads, width + 20, dim, dtype=dtype)[1 : rows + 1, :, 10 : 10 + width]
    value = torch.randn(rows + 2, kv_heads, width + 20, dim, dtype=dtype)[1 : rows + 1, :, 10 : 10 + width]
    starts = torch.randint(0, width, (rows,))
    starts[0] = 0
    got = kernel.attention(query, key, value, starts, dim**-0.5)
    assert got is not None and got.shape == (rows, queries, heads, dim) and got.is_contiguous()
    expected, real = _causal_reference(query, key, value, starts, dim**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (got.double() - expected)[real].abs().max().item() <= tol
    assert bool((got[~real] == 0).all()), "a padding query gets zeros"


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompt_gets_the_same_bits_alone_and_padded_in_a_group(dtype: Any) -> None:
    """The exactness the engine relies on for prompts: a padded prefill group == each prompt alone."""
    torch.manual_seed(3)
    query, key, value = (torch.randn(3, h, 40, 64, dtype=dtype) for h in (9, 3, 3))
    starts = torch.tensor([0, 10, 25])
    whole = kernel.attention(query, key, value, starts, 0.125)
    assert whole is not None
    for b in range(3):
        s = int(starts[b])
        alone = kernel.attention(query[b : b + 1, :, s:].clone(), key[b : b + 1, :, s:].clone(),
                                 value[b : b + 1, :, s:].clone(), torch.zeros(1, dtype=torch.int64), 0.125)
        assert alone is not None and torch.equal(whole[b, s:], alone[0])
    # a later chunk of a prompt (queries are the last columns of a longer cache) == the same queries in one go
    chunk = kernel.attention(query[:1, :, 30:], key[:1], value[:1], torch.zeros(1, dtype=torch.int64), 0.125)
    assert chunk is not None and torch.equal(chunk[0], whole[0, 30:])


@needs_kernel
def test_prompt_masks_are_recognised_or_refused() -> None:
    rows, queries, width = 2, 4, 7
    columns = torch.arange(width)
    position = (width - queries + torch.arange(queries)).view(1, queries, 1)
    starts = torch.tensor([0, 5])
    mask = (columns >= starts.view(2, 1, 1)) & (columns <= position)
    # SDPA's builder unmasks the fully masked rows of padding queries: still recognised
    unmasked = mask | ~mask.any(dim=-1, keepdim=True)
    for m in (mask, unmasked):
        got = ragged_attention.starts_from_mask(m.unsqueeze(1).clone(), rows, width, queries)
        assert got is not None and got.tolist() == [0, 5]
    not_causal = mask.clone()
    not_causal[0, 0, 6] = True  # the first query sees a later column
    assert ragged_attention.starts_from_mask(not_causal.unsqueeze(1), rows, width, queries) is None
    assert ragged_attention.starts_from_mask(mask.unsqueeze(1), rows, width, queries + 1) is None  # wrong shape


@needs_kernel
def test_a_non_causal_layer_goes_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def recording_sdpa(module: Any, query: Tensor, *args: Any, **kwargs: Any) -> tuple[None, None]:
        calls.append(query.shape[2])
        return None, None

    monkeypatch.setattr(ragged_attention, "_sdpa", recording_sdpa)

    class Bidirectional:
        is_causal = False

    query, key, value = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    ragged_attention.ragged_attention(Bidirectional(), query, key, value, None)
    ragged_attention.ragged_attention(object(), query, key, value, None, is_causal=False)
    assert calls == [3, 3]
    out, _ = ragged_attention.ragged_attention(object(), query, key, value, None)  # causal by default
    assert out is not None and out.shape == (1, 3, 4, 16)


# ---------------------------------------------------------------------------------------------
# 5. every code path of the kernel: the AVX2 one and the portable C one, whatever this CPU is

KERNEL_TESTS = ("test_kernel_equals_sdpa_with_the_padding_mask", "test_kernel_over_rows_and_widths",
                "test_kernel_property", "test_padding_is_never_read", "test_the_thread_count_does_not_change_the_bits",
                "test_a_row_gets_the_same_bits_alone_and_in_any_batch",
                "test_prompt_attention_is_causal_over_each_rows_tokens",
                "test_a_prompt_gets_the_same_bits_alone_and_padded_in_a_group")
# fp32 queries over a 16-bit (fp16 or bf16) key/value cache: the whole file, on each path too
KV16_TESTS = Path(__file__).with_name("test_attention_kv16.py")


@needs_kernel
@pytest.mark.skipif(os.environ.get("DJL_HANDLERS_KERNEL_MARCH") is not None, reason="already a capped build")
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 ISA levels")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v2"])
def test_the_kernel_tests_pass_built_for_each_x86_level(tmp_path: Path, march: str) -> None:
    """The kernel has an AVX-512, an AVX2 (x86-64-v3) and a portable C path; a CPU runs only its own
    natively, so the kernel tests run again on a library built for each lower level (the build
    flags, not the CPU, choose the path)."""
    env = dict(os.environ, DJL_HANDLERS_KERNEL_MARCH=march, DJL_HANDLERS_KERNEL_DIR=str(tmp_path / "kernels"))
    nodes = [*(f"{__file__}::{name}" for name in KERNEL_TESTS), str(KV16_TESTS)]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *nodes],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
                          timeout=600)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0 and " passed" in done.stdout, tail
    built = [p.name for p in (tmp_path / "kernels").glob("decode_attention-*.so")]
    assert built, "the kernel was not built at " + march + ": " + tail
    code = "from djl_handlers.kernels.decode_attention import path; print(path())"
    said = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert said.stdout.strip() == {"x86-64-v3": "avx2", "x86-64-v2": "plain C"}[march], said.stderr[-2000:]


@needs_kernel
def test_the_path_is_named_in_check_and_in_the_load_report(tiny_model: Any) -> None:
    from djl_handlers.cli import _cpu
    from djl_handlers.engines.hf.cpu.isa import features
    from djl_handlers.engines.hf.cpu.patches import use_ragged_attention

    named = kernel.path()
    level = features().isa
    marched = os.environ.get("DJL_HANDLERS_KERNEL_MARCH")
    if marched is None and os.uname().machine == "x86_64":  # built for this CPU: its best path
        assert named == ("avx2" if level == "avx2" else "plain C" if level == "baseline" else "avx512")
    assert named in ("avx512", "avx2", "plain C")
    assert _cpu({"engine": "huggingface", "device": "cpu"})["cpu"]["attentionKernel"] == named
    model, _ = tiny_model
    try:
        assert use_ragged_attention(model, required=False).endswith(f"(ragged kernel, {named} path)")
    finally:
        disable(model)
