"""The samples of a request that decodes several (``n``/``best_of`` > 1), as formatters and the
scheduler rank them: by cumulative log-probability (the sum of the tokens' log-probs under the
model's distribution), the highest first, ties in sample order; a beam search's hypotheses come
from the engine best first (by its beam score, which the length penalty weighs), and keep that order.
Nothing here imports an ML library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from djl_handlers.params.samples import returned_count
from djl_handlers.request.records import RequestOutput

__all__ = ["best_first", "cumulative_log_prob", "ranked", "returned"]


def cumulative_log_prob(out: RequestOutput) -> float:
    """The sum of the known, finite log-probs of ``out``'s tokens."""
    return sum(t.log_prob for t in out.tokens if t.log_prob is not None and math.isfinite(t.log_prob))


def ranked(outputs: Sequence[RequestOutput]) -> list[RequestOutput]:
    """``outputs`` from the highest cumulative log-probability to the lowest (stable)."""
    return sorted(outputs, key=cumulative_log_prob, reverse=True)


def returned(out: RequestOutput) -> list[RequestOutput]:
    """The samples the response holds, in its order: the first ``returned_count`` of
    ``out.sequences`` (the scheduler ranks them, best first, when fewer are returned than decoded);
    ``[out]`` for a one-sequence request; every choice of a request with several prompts."""
    if not out.sequences:
        return [out]
    if out.request.per_prompt:
        return out.sequences
    return out.sequences[: returned_count(out.request.params)]


def best_first(out: RequestOutput) -> tuple[RequestOutput, list[RequestOutput]]:
    """The best returned sample and the other returned ones in the response's order (LMI's
    ``generated_text`` + ``details.best_of_sequences``, TGI's the same); ``out`` itself and no
    others for a one-sequence request. A beam search's best is its first hypothesis."""
    if not out.sequences:
        return out, []
    shown = returned(out)
    best = shown[0] if out.request.params.num_beams > 1 else ranked(shown)[0]
    return best, [s for s in shown if s is not best]
