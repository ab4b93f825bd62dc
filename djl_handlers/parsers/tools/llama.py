"""Llama 3.x JSON calls (vLLM's ``llama3_json``): ``<|python_tag|>`` (optional) then one or more
``{"name": ..., "parameters": {...}}`` objects (``arguments`` also read), separated by ``;``.

As vLLM reads a whole reply: every ``{`` outside an object already read starts an object that
must be a call, or the whole reply is content; with calls, the text around them is dropped. A
stream is a call from its first character (``<|python_tag|>`` or ``{``), else content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from djl_handlers.parsers.markers import held_back
from djl_handlers.parsers.tools.base import ToolParse
from djl_handlers.parsers.tools.json_scan import Malformed, scan_call

__all__ = ["Llama3JsonParser"]

TAG = "<|python_tag|>"


@dataclass(frozen=True)
class Llama3JsonParser:
    """Llama 3's JSON calls."""

    name: str = "llama3_json"
    special_tokens: bool = True

    def parse(self, text: str, final: bool, tools: list[dict[str, Any]]) -> ToolParse:
        if final:
            return self._whole(text)
        head = text.lstrip()
        if not head or (not head.startswith(TAG) and not head.startswith("{")):
            if TAG.startswith(head):
                return ToolParse(None)
            return ToolParse(held_back(text, (), final))
        result = ToolParse(None)
        at = text.find("{")
        try:
            while at >= 0:
                call, end = scan_call(text, at)
                if call is not None:
                    result.calls.append(call)
                if end is None:
                    break
                at = text.find("{", end)
        except Malformed:
            pass
        return result

    def _whole(self, text: str) -> ToolParse:
        if TAG not in text and "{" not in text:
            return ToolParse(text)
        result = ToolParse(None)
        at = text.find("{")
        try:
            while at >= 0:
                call, end = scan_call(text, at)
                if call is None or end is None or not call.complete:
                    return ToolParse(text)
                result.calls.append(call)
                at = text.find("{", end)
        except Malformed:
            return ToolParse(text)
        return result if result.calls else ToolParse(text)
