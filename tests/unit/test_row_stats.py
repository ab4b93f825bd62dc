"""The argmax / log-sum-exp kernel (kernels/row_stats.py) and the greedy fast path of ``sample_batch``."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.hf.sampling import RowSampling, log_normalizer, sample_batch  # noqa: E402
from djl_handlers.kernels import row_stats as kernel  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

pytestmark = pytest.mark.skipif(not kernel.available(), reason=f"kernel not built: {kernel.unavailable_reason()}")
DTYPES = [torch.float32, torch.bfloat16]


def _logits(rows: int, vocab: int, dtype: Any, seed: int = 0, scale: float = 4.0) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=gen) * scale).to(dtype)


def _check(x: Any) -> None:
    got = kernel.row_stats(x)
    assert got is not None
    argmax, log_z = got
    assert argmax.dtype == torch.int64 and log_z.dtype == torch.float32 and argmax.shape == (x.shape[0],)
    assert torch.equal(argmax, x.float().argmax(dim=-1))
    want = torch.logsumexp(x.float(), dim=-1)
    assert torch.allclose(log_z, want, rtol=2e-6, atol=2e-5), float((log_z - want).abs().max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "vocab"), [(1, 1), (1, 7), (3, 17), (16, 49152), (5, 32000), (33, 1000), (2, 151936)])
def test_argmax_is_torchs_and_log_z_agrees_to_rounding(dtype: Any, rows: int, vocab: int) -> None:
    _check(_logits(rows, vocab, dtype, seed=rows * vocab))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0, 300.0])
def test_scales_from_flat_to_very_peaked(dtype: Any, scale: float) -> None:
    _check(_logits(4, 4096, dtype, scale=scale))


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_pick_the_first_maximum_like_torch(dtype: Any) -> None:
    x = torch.zeros(4, 300, dtype=dtype)
    x[0, [5, 7, 200]] = 3.0
    x[1, [299, 0]] = 2.0
    x[3, :] = -1.0  # the whole row tied
    _check(x)
    argmax, _ = kernel.row_stats(x)  # type: ignore[misc]
    assert argmax.tolist() == [5, 0, 0, 0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_minus_infinity_entries_are_masked_tokens(dtype: Any) -> None:
    x = _logits(3, 500, dtype)
    x[0, :499] = float("-inf")  # one token left
    x[1, ::2] = float("-inf")
    _check(x)
    _, log_z = kernel.row_stats(x)  # type: ignore[misc]
    assert float(log_z[0]) == float(x[0, 499].float())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", ["nan", "inf", "all-inf"])
def test_non_finite_rows_are_left_to_torch(dtype: Any, bad: str) -> None:
    x = _logits(4, 100, dtype)
    if bad == "all-inf":
        x[2, :] = float("-inf")
    else:
        x[2, 40] = float(bad)
    assert kernel.row_stats(x) is None
    assert kernel.row_stats(x[:2]) is not None  # the other rows alone are fine


def test_strided_rows_and_refused_inputs() -> None:
    base = _logits(6, 300, torch.float32)
    _check(base[::2])  # rows 600 elements apart
    _check(base[:, 10:290])  # rows not starting at the allocation
    _check(base.t().contiguous().t())  # column-major: copied first
    assert kernel.row_stats(base.double()) is None
    assert kernel.row_stats(base.half()) is None
    assert kernel.row_stats(base[0]) is None  # 1-D
    empty = kernel.row_stats(base[:0])
    assert empty is not None and empty[0].shape == (0,)


def _row(vocab: int, **params: Any) -> RowSampling:
    return RowSampling.from_params(GenerationParameters(**params), [1, 2, 3], vocab)


def _rows(n: int, vocab: int) -> list[RowSampling]:
    return [_row(vocab) for _ in range(n)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_batch_greedy_fast_path_matches_the_torch_formula(dtype: Any) -> None:
    x = _logits(8, 3000, dtype)
    result = sample_batch(x, _rows(8, 3000))
    ref = x.float()
    assert result.tokens == ref.argmax(-1).tolist() and result.errors == [None] * 8
    want = (ref.max(-1).values - torch.logsumexp(ref, -1)).tolist()
    assert all(math.isclose(a, b, rel_tol=1e-5, abs_tol=2e-5) for a, b in zip(result.log_probs, want, strict=True))
    assert all(lp <= 0.0 for lp in result.log_probs)


def test_sample_batch_mixed_rows_use_the_same_log_z() -> None:
    """A sampled row next to greedy ones: the greedy rows' log-probs equal the all-greedy batch's."""
    x = _logits(4, 2000, torch.float32)
    greedy = sample_batch(x, _rows(4, 2000))
    rows = _rows(3, 2000) + [_row(2000, do_sample=True, temperature=0.7, seed=3)]
    mixed = sample_batch(x, rows)
    assert mixed.tokens[:3] == greedy.tokens[:3] and mixed.log_probs[:3] == greedy.log_probs[:3]
    assert mixed.errors == [None] * 4 and mixed.log_probs[3] <= 0.0


def test_sample_batch_non_finite_row_still_errors_alone() -> None:
    x = _logits(3, 500, torch.float32)
    x[1, 7] = float("nan")
    result = sample_batch(x, _rows(3, 500))
    assert result.errors[1] is not None and result.tokens[1] == -1
    assert result.errors[0] is None and result.errors[2] is None
    assert result.tokens[0] == int(x[0].argmax()) and result.tokens[2] == int(x[2].argmax())


def test_log_normalizer_is_the_kernels_or_torchs() -> None:
    x = _logits(3, 700, torch.bfloat16)
    assert torch.equal(log_normalizer(x), kernel.row_stats(x)[1])  # type: ignore[index]
    x[0, 0] = float("nan")
    assert torch.isnan(log_normalizer(x)[0]) and torch.equal(log_normalizer(x)[1:], torch.logsumexp(x.float(), -1)[1:])
