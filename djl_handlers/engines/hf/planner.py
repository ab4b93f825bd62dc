"""The admission rules of an HF engine step: which queued prompts a step prefills, and whether a
long prompt starts its chunked prefill. Pure functions over the queue; the engine runs the forwards.

Rules (the engine's module docstring tells the whole step): prompts are taken in arrival order
within ``max_prefill_tokens`` padded tokens and the batch's free rows, first fit (a prompt that
does not fit what is left of the step's budget lets shorter ones behind it go first); a prompt
longer than the budget is prefilled in chunks, starting only on a full budget, and nobody
overtakes it; a row whose grammar is still compiling waits while others go ahead; a row whose
LoRA adapter cannot join yet (``max_loras``), or whose samples (``n``/``best_of``: one batch row
each) do not fit the free rows, holds the rows behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from djl_handlers.engines.hf.rows import Row

__all__ = ["MAX_PREFILL_PADDING", "Admits", "first_ready", "starts_chunked", "take_group"]

MAX_PREFILL_PADDING = 0.125  # the share of a prefill group's tokens that may be left padding

#: May ``row`` join the running batch next to the rows already taken this step (LoRA's ``max_loras``)?
Admits = Callable[[Row, Sequence[Row]], bool]


def first_ready(queue: Iterable[Row]) -> Row | None:
    """The first queued row that may be prefilled (its grammar, if any, is compiled)."""
    return next((r for r in queue if r.ready), None)


def starts_chunked(head: Row, budget: int, max_prefill_tokens: int, room: int, admits: Admits) -> bool:
    """Whether ``head``, longer than the prefill budget, starts its chunked prefill now: only on a
    full budget, with a free row for each of its samples, and when its adapter may join."""
    return budget == max_prefill_tokens and room >= head.width and admits(head, ())


def take_group(queue: Iterable[Row], budget: int, room: int, admits: Admits) -> list[Row]:
    """Queued rows, in arrival order, whose left-padded prefill fits ``budget`` tokens and whose
    samples fit ``room`` rows (first fit: a prompt that does not fit what is left of this step's budget is passed over
    for shorter ones behind it; it is considered first again at the next step). A prompt that would
    make padding more than ``MAX_PREFILL_PADDING`` of the group's tokens is left for the next group
    (padding costs a full token's compute; an extra forward costs one read of the weights, a few
    percent of a prefill). The rows stay in ``queue``; the caller takes them out."""
    group: list[Row] = []
    longest = real = rows = 0
    for row in [r for r in queue if r.ready]:  # rows whose grammar compiles wait
        if rows + row.width > room or not admits(row, group):
            break  # no room for its samples, or an adapter that cannot join yet: FIFO
        n = len(row.request.prompt_ids)
        padded = (len(group) + 1) * max(longest, n)
        if padded > budget or (group and padded - real - n > MAX_PREFILL_PADDING * padded):
            continue  # too long for what is left, or too unlike the group: a later group takes it
        longest, real, rows = max(longest, n), real + n, rows + row.width
        group.append(row)
    return group
