"""Granite 3.2's reasoning: plain-text headings, not tags.

The reply opens with ``Here is my thought process:`` (or ``Here's my thought process:``); the
answer follows ``Here is my response:`` (or ``Here's my response:``). A reply that does not open
with a thought-process heading is all answer, and so is a finished reply without the response
heading, as vLLM's ``granite`` parser reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from djl_handlers.parsers.markers import held_back
from djl_handlers.parsers.reasoning.base import ReasoningSplit

__all__ = ["GraniteParser"]

THINK_HEADINGS = ("Here is my thought process:", "Here's my thought process:")
ANSWER_HEADINGS = ("Here is my response:", "Here's my response:")


@dataclass(frozen=True)
class GraniteParser:
    """Granite's ``thought process`` / ``response`` headings."""

    name: str = "granite"

    def split(self, text: str, final: bool) -> ReasoningSplit:
        head = next((h for h in THINK_HEADINGS if text.startswith(h)), None)
        if head is None:
            if not final and any(h.startswith(text) for h in THINK_HEADINGS):
                return ReasoningSplit(None, None, 0)  # may still become the heading
            return ReasoningSplit(None, text, 0)
        body = len(head)
        found = [(text.find(a, body), a) for a in ANSWER_HEADINGS]
        found = [(i, a) for i, a in found if i >= 0]
        if found:
            at, answer = min(found)
            content_at = at + len(answer)
            return ReasoningSplit(text[body:at], text[content_at:], content_at)
        if final:
            return ReasoningSplit(None, text, 0)
        return ReasoningSplit(held_back(text[body:], ANSWER_HEADINGS, final), None, len(text))
