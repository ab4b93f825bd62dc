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

    Only the tail that could contain a new match is searched each time, so the cost per token
    is bounded by the longest stop sequence, not the text length.
    """

    __slots__ = ("_sequences", "_longest", "_scanned")

    def __init__(self, sequences: Sequence[str]):
        self._sequences = tuple(s for s in sequences if s)
        self._longest = max((len(s) for s in self._sequences), default=0)
        self._scanned = 0

    def __bool__(self) -> bool:
        return bool(self._sequences)

    def check(self, text: str) -> Optional[StopMatch]:
        """Look for a stop sequence in ``text`` (the whole generated text so far)."""
        if not self._sequences:
            return None
        start = max(0, self._scanned - self._longest + 1)
        best: Optional[StopMatch] = None
        for seq in self._sequences:
            pos = text.find(seq, start)
            if pos >= 0 and (best is None or pos + len(seq) < best.end):
                best = StopMatch(seq, pos + len(seq))
        self._scanned = len(text)
        return best
