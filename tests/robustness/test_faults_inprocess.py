"""Fault injection in-process: every scenario of ``faults.py`` must leave only the requests hit by
the fault failed (explicitly) and everything else exactly right."""

from __future__ import annotations

import pytest

from tests.robustness.faults import Scenario, scenarios


def _params() -> list[object]:
    return [pytest.param(s, id=s.name,
                         marks=[pytest.mark.xfail(strict=True, reason=s.known_bug)] if s.known_bug else [])
            for s in scenarios()]


@pytest.mark.parametrize("scenario", _params())
def test_fault_scenario(scenario: Scenario) -> None:
    assert scenario.run() == []
