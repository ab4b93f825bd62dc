"""When prompt-lookup speculation verifies: the acceptance estimates, the step cost model, the width rule."""

from __future__ import annotations

import random

import pytest

from djl_handlers.engines.hf.speculation_policy import (
    MARGIN,
    PRIOR_RATE,
    AcceptanceRates,
    Evidence,
    RowSpeculation,
    StepCost,
    expected_accepted,
    verify_width,
)


def test_expected_accepted_is_the_geometric_sum() -> None:
    assert expected_accepted(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_accepted(1.0, 4) == 4.0
    assert expected_accepted(0.0, 4) == 0.0
    assert expected_accepted(0.9, 0) == 0.0
    # more candidates never lower the expectation, and add less and less
    values = [expected_accepted(0.6, n) for n in range(6)]
    steps = [b - a for a, b in zip(values, values[1:], strict=False)]
    assert all(s > 0 for s in steps) and steps == sorted(steps, reverse=True)


def test_counts_estimate_the_per_candidate_rate() -> None:
    """Simulated drafts whose candidates are accepted with a known rate until the first rejection: the
    counts' estimate lands near it (and a wrong estimator, accepted / drafted, would not)."""
    draw = random.Random(3)
    for true_rate in (0.2, 0.5, 0.9):
        counts, drafted_total = Evidence(), 0
        for _ in range(4000):
            drafted = draw.randint(1, 4)
            accepted = 0
            while accepted < drafted and draw.random() < true_rate:
                accepted += 1
            counts.add(accepted, drafted)
            drafted_total += drafted
        assert counts.rate(0.5, 0.0) == pytest.approx(true_rate, abs=0.03)
        if true_rate < 0.9:
            assert abs(counts.accepted / drafted_total - true_rate) > 0.05  # the naive ratio is biased


def test_a_rows_record_scales_the_engine_rate_and_fades_back() -> None:
    rates = AcceptanceRates()
    good, bad = RowSpeculation([]), RowSpeculation([])
    assert rates.engine_rate(1) == PRIOR_RATE  # no evidence anywhere: the prior
    assert rates.expected(bad, 1, 4) == pytest.approx(expected_accepted(PRIOR_RATE, 4))
    for _ in range(6):  # the same match length, one row copying, the other not
        rates.record(good, 2, 4, 4)
        rates.record(bad, 2, 0, 4)
    engine = expected_accepted(rates.engine_rate(2), 4)
    assert rates.expected(bad, 2, 4) < 0.3 * engine < engine < rates.expected(good, 2, 4) <= 4.0
    assert bad.factor() < 1.0 < good.factor()
    for _ in range(200):  # the row's record fades much faster than the engine's rates
        bad.fade()
    assert bad.factor() == pytest.approx(1.0, abs=1e-3)
    assert rates.expected(bad, 2, 4) == pytest.approx(engine, rel=1e-3)
    for _ in range(1000):  # nothing verified for long: the engine's rates return to the prior
        rates.fade()
    assert rates.engine_rate(2) == pytest.approx(PRIOR_RATE, abs=1e-3)


def test_step_cost_is_a_fixed_cost_plus_one_per_token() -> None:
    cost = StepCost(16.0)
    assert cost.ratio(8, 0) == 1.0
    assert cost.ratio(8, 4) == pytest.approx((16 + 40) / (16 + 8))
    # one row: the fixed cost dominates and a wide step is nearly free; many rows: nearly linear
    assert cost.ratio(1, 4) < 1.3 < 2.0 < cost.ratio(64, 4) < 5.0
    assert StepCost.for_device("cpu").fixed_tokens < StepCost.for_device("cuda").fixed_tokens
    assert StepCost.free().ratio(64, 8) == 1.0


def gains(rate: float, lengths: list[int]) -> list[list[float]]:
    return [[expected_accepted(rate, w) for w in range(1, n + 1)] for n in lengths]


def test_the_width_pays_for_itself() -> None:
    cost = StepCost(16.0)
    # eight rows of text nobody can predict: the plain step
    assert verify_width(gains(0.15, [4] * 8), cost) == 0
    # the same rows copying: the widest step
    assert verify_width(gains(0.95, [4] * 8), cost) == 4
    # one row alone: its forward costs little more than a plain one, a poor rate still pays
    assert verify_width(gains(0.3, [4]), cost) > 0
    # no candidates: nothing to verify, whatever the cost
    assert verify_width(gains(0.9, [0] * 4), StepCost.free()) == 0
    # free verification: any candidate is worth it
    assert verify_width(gains(0.5, [2, 0]), StepCost.free()) == 2
    assert verify_width(gains(0.01, [2, 0]), StepCost.free()) == 2
    # a middling rate picks a width in between, the one with the least time per token
    middle = verify_width(gains(0.6, [4] * 8), cost)
    assert 0 < middle < 4

    def per_token(width: int) -> float:
        return cost.ratio(8, width) / (1 + expected_accepted(0.6, width))
    assert per_token(middle) == min(per_token(w) for w in range(5)) < per_token(0)
    # rows that copy do not buy a wide step with the time of as many rows that cannot
    assert verify_width([*gains(0.95, [4] * 4), *gains(0.15, [4] * 4)], cost) == 0
    assert verify_width([*gains(0.95, [4] * 7), *gains(0.15, [4])], cost) > 0  # but seven for one, yes
    # one row, one candidate: it must save more than the step's extra time with the margin on it
    extra = cost.ratio(1, 1) - 1.0
    assert verify_width(gains(extra * (1 + MARGIN) * 0.9, [1]), cost) == 0  # would pay without the margin
    assert extra < extra * (1 + MARGIN) * 0.9
    assert verify_width(gains(extra * (1 + MARGIN) * 1.1, [1]), cost) == 1
