"""Per-row sampling: isolation of failures, filters, seeds, min_new_tokens (no model needed)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from djl_handlers.engines.hf.sampling import RowSampling, sample_batch  # noqa: E402
from djl_handlers.params.generation import GenerationParameters  # noqa: E402

VOCAB = 64


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=gen) * 3


def row(**params: object) -> RowSampling:
    return RowSampling.from_params(GenerationParameters(**params), [1, 2, 3], VOCAB, eos_token_ids=(2,))


def test_greedy_is_argmax_with_model_log_prob() -> None:
    x = logits(3)
    result = sample_batch(x, [row(), row(), row()])
    assert result.tokens == x.argmax(-1).tolist()
    expected = torch.log_softmax(x, -1).max(-1).values.tolist()
    assert result.log_probs == pytest.approx(expected, abs=1e-6)
    assert result.errors == [None, None, None]


def test_a_failing_row_does_not_fail_its_neighbours() -> None:
    x = logits(3)
    x[1, 5] = float("nan")
    bad_sampler = row(do_sample=True, seed=1, top_k=5)
    bad_sampler.top_k = VOCAB + 10  # topk() will raise for this row only
    rows = [row(do_sample=True, seed=1, top_k=5), row(), bad_sampler]
    result = sample_batch(x, rows)
    assert result.errors[0] is None and result.tokens[0] >= 0
    assert result.errors[1] is not None and result.tokens[1] == -1
    assert result.errors[2] is not None and "sampling failed" in result.errors[2]
    assert math.isfinite(result.log_probs[0]) and result.log_probs[0] <= 0


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    x = logits(2, seed=3)
    result = sample_batch(x, [row(do_sample=True, seed=5, top_k=1), row(do_sample=True, seed=5, top_p=1e-6)])
    assert result.tokens == x.argmax(-1).tolist()


def test_top_k_keeps_sampling_inside_the_top_k() -> None:
    x = logits(1, seed=4)
    allowed = set(torch.topk(x[0], 3).indices.tolist())
    sampler = row(do_sample=True, seed=11, top_k=3, temperature=5.0)
    picks = {sample_batch(x, [sampler]).tokens[0] for _ in range(40)}
    assert picks <= allowed and len(picks) > 1


def test_typical_p_restricts_the_support() -> None:
    x = logits(1, seed=6)
    sampler = row(do_sample=True, seed=2, typical_p=0.2)
    picks = {sample_batch(x, [sampler]).tokens[0] for _ in range(40)}
    assert 0 < len(picks) < 10


def test_seeded_draws_do_not_depend_on_neighbours() -> None:
    x = logits(4, seed=8)
    alone = [sample_batch(x[2:3], [row(do_sample=True, seed=42)]) for _ in range(1)]
    mixed = sample_batch(x, [row(do_sample=True, seed=1), row(), row(do_sample=True, seed=42), row()])
    assert mixed.tokens[2] == alone[0].tokens[0]


def test_min_new_tokens_suppresses_eos_then_allows_it() -> None:
    x = torch.zeros(1, VOCAB)
    x[0, 2] = 10.0  # eos is the clear favourite
    sampler = row(min_new_tokens=2)
    assert sample_batch(x, [sampler]).tokens[0] != 2
    assert sample_batch(x, [sampler]).tokens[0] != 2
    assert sample_batch(x, [sampler]).tokens[0] == 2


def test_repetition_penalty_pushes_seen_tokens_down() -> None:
    x = torch.zeros(1, VOCAB)
    x[0, 3] = 1.0  # seen in the prompt
    x[0, 9] = 0.9
    assert sample_batch(x, [row()]).tokens[0] == 3
    assert sample_batch(x, [row(repetition_penalty=1.2)]).tokens[0] == 9
