"""When prompt-lookup speculation pays: each row's acceptance estimate, the decode step's cost model,
and the verify width a step uses (0: the plain step).

The rule, per decode step (the "goodput" of vLLM's SmartSpec work, tokens per second, read rather than
copied): a step that verifies ``w`` columns feeds ``B * (1 + w)`` tokens for ``B`` rows and yields ``B``
tokens plus the accepted candidates; a plain step feeds and yields ``B``. With ``t(n)`` the time of a
forward that feeds ``n`` tokens, the step picks the ``w`` in ``0..K`` with the most expected tokens per
second, ``(B + sum_i E_i(w)) / t(B * (1 + w))``; ``w = 0`` is the plain step, which a verifying
width must beat by :data:`MARGIN` (the estimates are noisy, and the steps picked for a high estimate
are those whose estimate erred upwards).

* **Expected accepted tokens** ``E_i(w)``: candidates are accepted one after the other with
  probability ``a`` each until the first rejection, so ``m`` of them bring ``a + a^2 + ... + a^m``
  (``m``: the row's candidates cut at ``w``). ``a`` is estimated per n-gram match length (on fresh text
  a one-token match is mostly wrong, a three-token one mostly right) over every row's verified drafts:
  ``accepted / (accepted + rejections)`` (each verified candidate is a trial, a draft that stopped
  early holds one failure: the estimate that fits them best), counts fading by :data:`RATE_DECAY` per
  decode step, starting from :data:`PRIOR_RATE`. Each row scales that expectation by its own record,
  ``(accepted + 1) / (expected + 1)`` over its recent verified drafts (:data:`ROW_PRIOR_TOKENS`; fading
  by :data:`ROW_DECAY` per step): a row whose text cannot be predicted drives its factor down and stops
  paying for steps; as its record fades it is estimated by the engine's rates again, and verified when
  that pays (a probe). When nothing is verified for long, the engine's rates fade back to
  :data:`PRIOR_RATE`, so a workload that turned predictable is tried again.
* **Step time** ``t(n) = fixed + per_token * n``: fitted (least squares, fading by :data:`COST_DECAY`
  per step) to the measured wall time of recent steps, plain and verifying; until the steps seen
  spread enough, the line keeps the shape of :data:`PRIOR_FIXED_TOKENS` (how many tokens the fixed
  cost of a forward is worth: on a CPU a few tens, on a GPU hundreds), scaled to the measured times.
  On 2 CPU cores with a 135M model, 8 rows: a plain step ~45 ms, ``w = 4`` ~96 ms, so the four
  candidates of each row must bring more than one accepted token on average; with one row, ``w = 4``
  costs ~15 % more than a plain step, which a quarter of a token accepted per step pays for (with
  the margin).

Rows with candidates all verify them in a step that verifies (cut at ``w``): the filler columns of a
row with none cost the same, so a row that would not pay for a step rides along for free (and its
rate learns from it). The decisions depend on measured times: greedy output is the same either way,
and sampling keeps its distribution, but a seeded sampling request is not reproducible draw for draw
(which steps verified differs between runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["COST_DECAY", "MARGIN", "PRIOR_DRAFTS", "PRIOR_FIXED_TOKENS", "PRIOR_RATE", "RATE_DECAY", "ROW_DECAY",
           "ROW_PRIOR_TOKENS",
           "AcceptanceRates", "Evidence", "RowSpeculation", "StepCost", "expected_accepted", "verify_width"]

#: The acceptance rate (per candidate) assumed before any draft of a match length was verified.
PRIOR_RATE = 0.6
#: How many drafts' worth of weight the prior (engine level) and the engine's rate (row level) carry.
PRIOR_DRAFTS = 2.0
#: The engine's counts per match length fade by this per decode step (about 50 steps of memory).
RATE_DECAY = 0.98
#: A row's record fades by this per decode step (about its last 20 steps).
ROW_DECAY = 0.95
#: The weight of the neutral record (as expected) in a row's factor, in accepted tokens.
ROW_PRIOR_TOKENS = 1.0
#: Verify only when the expected tokens per second beat the plain step's by this share: the estimates
#: are noisy, and the steps chosen for a high estimate are those whose estimate erred upwards.
MARGIN = 0.1
#: The step timings fade by this per step (about the last 30 steps).
COST_DECAY = 0.97
#: Before the timings spread: a forward's fixed cost in tokens fed, by device type (default: "other").
PRIOR_FIXED_TOKENS = {"cpu": 32.0, "other": 512.0}


@dataclass
class Evidence:
    """Fading counts of verified candidates: accepted ones and drafts that stopped at a rejection."""

    accepted: float = 0.0
    rejected: float = 0.0

    def add(self, accepted: int, drafted: int) -> None:
        self.accepted += accepted
        self.rejected += 1.0 if accepted < drafted else 0.0

    def fade(self, factor: float) -> None:
        self.accepted *= factor
        self.rejected *= factor

    def rate(self, prior: float, weight: float) -> float:
        """The per-candidate acceptance: the counts plus ``weight`` drafts' worth at ``prior``."""
        return (self.accepted + weight * prior) / (self.accepted + self.rejected + weight)


@dataclass
class RowSpeculation:
    """One row's speculation state: its lookup context (prompt and chosen tokens) and its record
    against the engine's rates (fading counts of accepted candidates, and of those the engine's rates
    expected for the same drafts); it lives on the row and dies with it."""

    history: list[int]
    accepted: float = 0.0
    expected: float = 0.0

    def factor(self) -> float:
        """How this row's drafts fare against the engine's expectation (1: as expected)."""
        return (self.accepted + ROW_PRIOR_TOKENS) / (self.expected + ROW_PRIOR_TOKENS)

    def fade(self) -> None:
        self.accepted *= ROW_DECAY
        self.expected *= ROW_DECAY


class AcceptanceRates:
    """The engine-wide acceptance counts per match length, and a row's expected accepted tokens."""

    def __init__(self) -> None:
        self.evidence: dict[int, Evidence] = {}

    def fade(self) -> None:
        for counts in self.evidence.values():
            counts.fade(RATE_DECAY)

    def engine_rate(self, match: int) -> float:
        counts = self.evidence.get(match)
        return counts.rate(PRIOR_RATE, PRIOR_DRAFTS) if counts is not None else PRIOR_RATE

    def expected(self, row: RowSpeculation, match: int, count: int) -> float:
        """The accepted candidates expected of ``count`` found by a ``match``-token n-gram in ``row``:
        the engine's expectation for that match length scaled by the row's record (at most ``count``)."""
        return min(float(count), row.factor() * expected_accepted(self.engine_rate(match), count))

    def record(self, row: RowSpeculation, match: int, accepted: int, drafted: int) -> None:
        """One verified draft of ``drafted`` candidates, ``accepted`` of them kept."""
        row.expected += expected_accepted(self.engine_rate(match), drafted)
        row.accepted += accepted
        self.evidence.setdefault(match, Evidence()).add(accepted, drafted)


class StepCost:
    """A decode step's wall time as ``fixed + per_token * tokens fed``, fitted to recent steps (with
    ``learn=False`` the prior's shape only: the decisions then depend on the counts alone)."""

    def __init__(self, prior_fixed_tokens: float, learn: bool = True) -> None:
        self.prior_fixed_tokens = prior_fixed_tokens
        self.learn = learn
        self._w = self._n = self._nn = self._t = self._nt = 0.0  # fading weighted sums

    @classmethod
    def free(cls) -> StepCost:
        """Verifying costs nothing more than a plain step: every step with a candidate verifies."""
        return cls(math.inf, learn=False)

    def observe(self, tokens: int, seconds: float) -> None:
        """A step that fed ``tokens`` tokens took ``seconds``."""
        if not self.learn:
            return
        d = COST_DECAY
        self._w, self._n, self._nn = d * self._w + 1.0, d * self._n + tokens, d * self._nn + tokens * tokens
        self._t, self._nt = d * self._t + seconds, d * self._nt + tokens * seconds

    def line(self) -> tuple[float, float] | None:
        """``(fixed, per_token)`` in seconds, None before any step was timed. Least squares over the
        fading sums plus a prior line through their mean with the prior's shape, weighing as two steps
        spread over ``0..2 * mean`` (so the data decides once plain and verifying steps both occurred)."""
        if self._w <= 0.0:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var = max(self._nn / self._w - mean_n * mean_n, 0.0)
        cov = self._nt / self._w - mean_n * mean_t
        prior_slope = mean_t / (self.prior_fixed_tokens + mean_n)
        spread = 2.0 * mean_n * mean_n  # two pseudo-steps at 0 and 2 * mean: weight times variance
        slope = max((self._w * cov + spread * prior_slope) / (self._w * var + spread), 0.0)
        fixed = max(mean_t - slope * mean_n, 0.0)
        return fixed, slope

    def ratio(self, rows: int, width: int) -> float:
        """The time of a step verifying ``width`` columns over a plain step's, for ``rows`` rows."""
        line = self.line()
        if line is None and math.isinf(self.prior_fixed_tokens):
            return 1.0
        fixed, slope = line if line is not None else (self.prior_fixed_tokens, 1.0)
        plain = fixed + slope * rows
        if plain <= 0.0:
            return 1.0
        return (fixed + slope * rows * (1 + width)) / plain


def expected_accepted(rate: float, count: int) -> float:
    """Expected accepted candidates of ``count`` when each is accepted with ``rate`` until one is not."""
    total, term = 0.0, 1.0
    for _ in range(count):
        term *= rate
        total += term
    return total


def verify_width(gains: Sequence[Sequence[float]], cost: StepCost) -> int:
    """The verify width with the most expected tokens per second for a step of ``len(gains)`` rows
    (``gains[i][w - 1]``: row ``i``'s expected accepted candidates when it verifies ``w``, as many
    entries as it has candidates); 0: the plain step, also unless the best beats it by :data:`MARGIN`."""
    rows = len(gains)
    plain = float(rows)  # the plain step: one token per row per unit of time
    best_width, best = 0, plain * (1.0 + MARGIN)
    for width in range(1, max((len(g) for g in gains), default=0) + 1):
        gain = sum(g[min(width, len(g)) - 1] for g in gains if g)
        value = (rows + gain) / cost.ratio(rows, width)
        if value > best:
            best_width, best = width, value
    return best_width
