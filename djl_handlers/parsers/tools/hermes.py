"""Hermes-style calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
(Hermes 2 Pro, Qwen2.5 and Qwen3's JSON calls; vLLM's ``hermes`` and ``qwen3_json``).

The content is the text before the first block (None when empty). A last block may lack its
``</tool_call>``. When a block does not hold a call object, the whole reply is content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from djl_handlers.parsers.markers import held_back
from djl_handlers.parsers.tools.base import ToolParse
from djl_handlers.parsers.tools.json_scan import Malformed, scan_call, skip_space

__all__ = ["HermesParser"]

START, END = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class HermesParser:
    """``<tool_call>`` JSON blocks."""

    name: str = "hermes"
    special_tokens: bool = False

    def parse(self, text: str, final: bool, tools: list[dict[str, Any]]) -> ToolParse:
        first = text.find(START)
        if first < 0:
            return ToolParse(held_back(text, (START,), final) or None)
        result = ToolParse(text[:first] or None)
        at = first
        try:
            while at >= 0:
                body = skip_space(text, at + len(START))
                if body >= len(text):
                    break
                call, end = scan_call(text, body)
                if call is not None:
                    result.calls.append(call)
                if end is None:
                    break
                if call is None:
                    raise Malformed("a call needs a name")
                at = text.find(START, end)
        except Malformed:
            if final:
                return ToolParse(text)
            return ToolParse(result.content, result.calls)
        if final and any(not c.complete for c in result.calls):
            return ToolParse(text)
        return result
