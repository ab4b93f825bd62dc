"""When prompt-lookup speculation pays: each row's acceptance estimate, the decode step's cost model,
and the verify width a step uses (0: the plain step).

The rule, per decode step: a step that verifies ``w`` columns feeds ``B * (1 + w)`` tokens for ``B``
rows, and row ``i`` gets ``1 + E_i(w)`` tokens from it (``E_i``: its expected accepted candidates); a
plain step feeds ``B`` and gives each row one. With ``t(n)`` the time of a forward that feeds ``n``
tokens, the step picks the ``w`` in ``0..K`` that gives the rows the least mean time per token,
``t(B * (1 + w)) * mean_i 1 / (1 + E_i(w))``; ``w = 0`` is the plain step. The wide step's extra
time, ``t(B * (1 + w)) - t(B)``, counts :data:`MARGIN` more than modelled: the estimates are noisy,
and the steps picked for a good estimate are those whose estimate erred upwards. Per row, not per
batch: the batch's tokens per second (the "goodput" of vLLM's SmartSpec work) would let rows that
copy buy a wide step with the time of rows that cannot, which get one token each from it; and a
burst ends with its slowest rows.

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
* **Step time** ``t(n) = fixed + per_token * n``, in units of ``per_token``: ``FIXED_TOKENS + n``
  (:data:`FIXED_TOKENS`, by device type), so a verifying step costs ``(F + B (1 + w)) / (F + B)``
  plain ones. On 2 CPU cores with a 135M model, 8 rows: ``w = 4`` costs ~2.3 plain steps, so the
  four candidates of each row must bring more than 1.3 accepted tokens on average (1.9 with the
  margin); with one row ``w = 4`` costs ~1.24 plain steps. A fixed shape, not measured times: on a
  shared machine the times of neighbouring steps differ by more than the effect, and fixed, the
  decisions depend only on the tokens, so a run is reproducible.

Rows with candidates all verify them in a step that verifies (cut at ``w``): the filler columns of a
row with none cost the same, so a row that would not pay for a step rides along for free (and its
record learns from it). Greedy output is the same whichever steps verify, and sampling keeps its
distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FIXED_TOKENS", "MARGIN", "PRIOR_DRAFTS", "PRIOR_RATE", "RATE_DECAY", "ROW_DECAY", "ROW_PRIOR_TOKENS",
           "AcceptanceRates", "Evidence", "RowSpeculation", "StepCost", "expected_accepted", "verify_width"]

#: The acceptance rate (per candidate) assumed before any draft of a match length was verified.
PRIOR_RATE = 0.6
#: How many drafts' worth of weight the prior carries in the engine's rate of a match length.
PRIOR_DRAFTS = 2.0
#: The engine's counts per match length fade by this per decode step (about 50 steps of memory).
RATE_DECAY = 0.98
#: A row's record fades by this per decode step (about its last 20 steps).
ROW_DECAY = 0.95
#: The weight of the neutral record (as expected) in a row's factor, in accepted tokens.
ROW_PRIOR_TOKENS = 1.0
#: A wide step's extra time counts this share more than modelled (noisy estimates, chosen when high).
MARGIN = 0.4
#: A forward's fixed cost in tokens fed, by device type ("other": any but the CPU). Measured on 2 CPU
#: cores (SmolLM2-135M, fp32, the CPU kernels): ``t(n) ~ 33 ms + 1.45 ms * n`` quiet, ~17-20 tokens
#: under load; this is the machine's balance of memory bandwidth to compute, so about the same for a
#: larger model on the same CPU, and some hundreds on a GPU, whose decode step barely grows with a few
#: more tokens per row. Erring low only makes the rule verify less often.
FIXED_TOKENS = {"cpu": 16.0, "other": 256.0}


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


@dataclass(frozen=True)
class StepCost:
    """A decode step's time as ``fixed_tokens + tokens fed``, in the time one fed token takes: the
    forward's fixed cost (reading the weights, launching the layers) worth ``fixed_tokens`` tokens."""

    fixed_tokens: float

    @classmethod
    def for_device(cls, kind: str) -> StepCost:
        """The model for a device type (``"cpu"``, ``"cuda"``, ...): :data:`FIXED_TOKENS`."""
        return cls(FIXED_TOKENS.get(kind, FIXED_TOKENS["other"]))

    @classmethod
    def free(cls) -> StepCost:
        """Verifying costs nothing more than a plain step: every step with a candidate that clears the
        margin verifies."""
        return cls(math.inf)

    def ratio(self, rows: int, width: int) -> float:
        """The time of a step verifying ``width`` columns over a plain step's, for ``rows`` rows."""
        if math.isinf(self.fixed_tokens):
            return 1.0
        return (self.fixed_tokens + rows * (1 + width)) / (self.fixed_tokens + rows)


def expected_accepted(rate: float, count: int) -> float:
    """Expected accepted candidates of ``count`` when each is accepted with ``rate`` until one is not."""
    total, term = 0.0, 1.0
    for _ in range(count):
        term *= rate
        total += term
    return total


def verify_width(gains: Sequence[Sequence[float]], cost: StepCost) -> int:
    """The verify width that gives the rows of a step (``len(gains)``) the least mean time per token
    (``gains[i][w - 1]``: row ``i``'s expected accepted candidates when it verifies ``w``, as many
    entries as it has candidates); 0: the plain step. The wide step's extra time counts
    :data:`MARGIN` more than the model says."""
    rows = len(gains)
    best_width, best = 0, float(rows)  # the plain step: one step's time per token, each row
    for width in range(1, max((len(g) for g in gains), default=0) + 1):
        per_token = sum(1.0 / (1.0 + g[min(width, len(g)) - 1]) if g else 1.0 for g in gains)
        value = (1.0 + (cost.ratio(rows, width) - 1.0) * (1.0 + MARGIN)) * per_token
        if value < best:
            best_width, best = width, value
    return best_width
