"""Reasoning between ``<think>`` and ``</think>`` (DeepSeek-R1, Qwen3 and the models that copy them).

``deepseek_r1``: the chat template opens the reasoning itself, so a reply is reasoning until
``</think>`` even without ``<think>``; a reply that never closes it is all reasoning.
``qwen3`` reads the same (Qwen3's newer templates open it too) but reports an empty reasoning as
none. In both, text before ``<think>`` is dropped, as vLLM does, and the answer is the text after
``</think>``. A request that turns thinking off (``chat_template_kwargs``) is not parsed at all
(the dialect's rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from djl_handlers.parsers.markers import held_back
from djl_handlers.parsers.reasoning.base import ReasoningSplit

__all__ = ["ThinkParser"]

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ThinkParser:
    """``<think>`` reasoning; ``implicit_start``: reasoning begins before any ``<think>``;
    ``empty_is_none``: an empty reasoning is reported as none."""

    name: str
    implicit_start: bool = True
    empty_is_none: bool = False
    start: str = START
    end: str = END

    def split(self, text: str, final: bool) -> ReasoningSplit:
        opened = text.find(self.start)
        body_at = opened + len(self.start) if opened >= 0 else 0
        closed = text.find(self.end, body_at)
        if closed >= 0:
            content_at = closed + len(self.end)
            reasoning = text[body_at:closed]
            return ReasoningSplit(None if self.empty_is_none and not reasoning else reasoning, text[content_at:],
                                  content_at)
        if opened < 0 and not self.implicit_start:
            shown = held_back(text, (self.start, self.end), final)
            if final or shown:
                return ReasoningSplit(None, shown, 0)
            return ReasoningSplit(None, None, 0)  # may still become reasoning
        markers = (self.end,) if opened >= 0 else (self.end, self.start)  # "<think" may still open it
        reasoning = held_back(text[body_at:], markers, final)
        return ReasoningSplit(reasoning, None, len(text))
