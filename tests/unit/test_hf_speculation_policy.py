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


def test_step_cost_fits_a_line_and_keeps_the_prior_shape_until_the_steps_spread() -> None:
    fixed, per_token = 0.040, 0.0015
    cost = StepCost(prior_fixed_tokens=32.0)
    assert cost.line() is None
    assert cost.ratio(8, 4) == pytest.approx((32 + 40) / (32 + 8))  # the prior before any timing
    for _ in range(40):  # plain steps only: one point, the slope is the prior's
        cost.observe(8, fixed + per_token * 8)
    line = cost.line()
    assert line is not None
    assert line[0] + line[1] * 8 == pytest.approx(fixed + per_token * 8)
    assert line[0] / line[1] == pytest.approx(32.0, rel=0.01)  # fixed cost worth 32 tokens
    for _ in range(40):  # verifying steps too: the data decide
        cost.observe(40, fixed + per_token * 40)
        cost.observe(8, fixed + per_token * 8)
    line = cost.line()
    assert line is not None
    assert line[1] == pytest.approx(per_token, rel=0.05) and line[0] == pytest.approx(fixed, rel=0.05)
    assert cost.ratio(8, 4) == pytest.approx((fixed + per_token * 40) / (fixed + per_token * 8), rel=0.02)
    frozen = StepCost(32.0, learn=False)
    frozen.observe(40, 1.0)
    assert frozen.line() is None and StepCost.free().ratio(64, 8) == 1.0


def gains(rate: float, lengths: list[int]) -> list[list[float]]:
    return [[expected_accepted(rate, w) for w in range(1, n + 1)] for n in lengths]


def test_the_width_pays_for_itself() -> None:
    cost = StepCost(prior_fixed_tokens=32.0, learn=False)
    # eight rows of text nobody can predict: the plain step
    assert verify_width(gains(0.15, [4] * 8), cost) == 0
    # the same rows copying: the widest step
    assert verify_width(gains(0.95, [4] * 8), cost) == 4
    # one row alone: its forward costs little more than a plain one, a poor rate still pays
    assert verify_width(gains(0.3, [4]), cost) > 0
    # no candidates: nothing to verify, whatever the cost
    assert verify_width(gains(0.9, [0] * 4), StepCost.free()) == 0
    # free verification: any candidate that beats the margin is worth it
    assert verify_width(gains(0.5, [2, 0]), StepCost.free()) == 2
    assert verify_width(gains(0.01, [2, 0]), StepCost.free()) == 0
    # a middling rate picks a width in between, the one with the most expected tokens per unit of time
    middle = verify_width(gains(0.6, [4] * 8), cost)
    assert 0 < middle < 4

    def value(width: int) -> float:
        return (8 + 8 * expected_accepted(0.6, width)) / cost.ratio(8, width)
    assert value(middle) == max(value(w) for w in range(5)) > value(0) * (1 + MARGIN)
    # a gain that does not clear the margin is not taken, even when verifying is free
    assert verify_width(gains(MARGIN * 0.8, [1]), StepCost.free()) == 0
    assert verify_width(gains(MARGIN * 1.2, [1]), StepCost.free()) == 1
