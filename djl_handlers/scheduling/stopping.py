"""Stopping criteria applied by the scheduler for engines that do not stop on their own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class StopMatch:
    """A stop sequence found in the generated text; ``end`` is the index just after it."""

    sequence: str
    end: int


class StopSequenceMatcher:
    """Finds the earliest stop sequence in generated text, also across token boundaries.

    Text arrives piece by piece; only the last ``longest - 1`` characters seen before are kept,
    so the cost per piece is bounded by the longest stop sequence, not the text length.
    """

    __slots__ = ("_sequences", "_keep", "_tail")

    def __init__(self, sequences: Sequence[str]):
        self._sequences = tuple(s for s in sequences if s)
        self._keep = max((len(s) for s in self._sequences), default=1) - 1
        self._tail = ""

    def __bool__(self) -> bool:
        return bool(self._sequences)

    def push(self, text: str) -> Optional[StopMatch]:
        """Add the next piece of generated text; on a match, ``end`` is the position in ``text``
        just after the earliest stop sequence (the rest of ``text`` is past the stop). Only a stop
        sequence that ends inside ``text`` matches (one seen before and passed over, e.g. before
        ``min_new_tokens``, does not match again)."""
        window = self._tail + text
        best: Optional[StopMatch] = None
        for seq in self._sequences:
            pos = window.find(seq, max(0, len(self._tail) - len(seq) + 1))
            if pos >= 0 and (best is None or pos + len(seq) < best.end):
                best = StopMatch(seq, pos + len(seq))
        self._tail = window[max(0, len(window) - self._keep) :] if self._keep else ""
        if best is None:
            return None
        return StopMatch(best.sequence, best.end - (len(window) - len(text)))
