"""What a reasoning parser returns, and the protocol every one of them follows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

__all__ = ["ReasoningParser", "ReasoningSplit"]


@dataclass(frozen=True)
class ReasoningSplit:
    """One reading of a reply: ``reasoning`` (None: the reply has none) and ``content`` (None:
    no answer yet); ``content_start``: the offset in the text where the answer begins (the
    tokens before it are reasoning tokens)."""

    reasoning: Optional[str]
    content: Optional[str]
    content_start: int


class ReasoningParser(Protocol):
    """Splits the text generated so far; with ``final`` false, text that may still turn into a
    marker is held back, so each field of a later reading starts with the same field of an
    earlier one."""

    @property
    def name(self) -> str:
        """The parser's registered name."""
        ...

    def split(self, text: str, final: bool) -> ReasoningSplit:
        """The reasoning and the answer of ``text``."""
        ...
