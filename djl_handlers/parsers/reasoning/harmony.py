"""gpt-oss's harmony format: the reasoning is the ``analysis`` channel, the answer the ``final`` one.

A reply reads ``<|channel|>analysis<|message|>REASONING<|end|><|start|>assistant<|channel|>final
<|message|>ANSWER<|return|>`` (the markers are special tokens, so the request keeps them:
``skip_special_tokens`` false). Text of other channels (``commentary``: tool calls) is neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from djl_handlers.parsers.markers import held_back
from djl_handlers.parsers.reasoning.base import ReasoningSplit

__all__ = ["HarmonyParser"]

_MESSAGE = re.compile(r"<\|channel\|>(\w+)[^<]*<\|message\|>")
_ENDS = ("<|end|>", "<|return|>", "<|call|>", "<|start|>")
MARKERS = ("<|channel|>", "<|message|>", *_ENDS)


@dataclass(frozen=True)
class HarmonyParser:
    """Harmony channels read from text."""

    name: str = "openai_gptoss"
    special_tokens: bool = True  # the channel markers are special tokens: the request keeps them

    def split(self, text: str, final: bool) -> ReasoningSplit:
        reasoning: Optional[str] = None
        content: Optional[str] = None
        content_start = len(text)
        for match in _MESSAGE.finditer(text):
            body_at = match.end()
            end = min((i for i in (text.find(e, body_at) for e in _ENDS) if i >= 0), default=-1)
            body = text[body_at:end] if end >= 0 else held_back(text[body_at:], MARKERS, final)
            if match.group(1) == "analysis":
                reasoning = (reasoning or "") + body
            elif match.group(1) == "final":
                content = (content or "") + body
                content_start = min(content_start, body_at)
        if reasoning is None and content is None and "<|channel|>" not in text:
            shown = held_back(text, MARKERS, final)
            return ReasoningSplit(None, shown if (shown or final) else None, 0)
        return ReasoningSplit(reasoning, content, content_start)
