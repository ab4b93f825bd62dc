"""Text helpers the parsers share: the held-back tail of a stream that may be the start of a marker."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["held_back", "partial_marker_start"]


def partial_marker_start(text: str, markers: Iterable[str]) -> int:
    """The index where a proper prefix of one of ``markers`` ends ``text`` (the earliest such
    index), or ``len(text)`` when no marker could begin in the text's tail."""
    cut = len(text)
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:size]):
                cut = min(cut, len(text) - size)
                break
    return cut


def held_back(text: str, markers: Iterable[str], final: bool) -> str:
    """``text`` less a tail that may still grow into a marker (nothing is held when ``final``)."""
    return text if final else text[: partial_marker_start(text, markers)]
