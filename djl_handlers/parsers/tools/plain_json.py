"""The built-in reading of a reply when no ``option.tool_call_parser`` is set: the whole reply is
one call object ``{"name": ..., "arguments": {...}}``, a list of them, or ``<tool_call>`` blocks
holding them; only the request's own function names count. Anything else is content.

A stream cannot know a reply is a call before it ends, so nothing is sent until then.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from djl_handlers.parsers.tools.base import ParsedCall, ToolParse

__all__ = ["PlainJsonParser"]

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass(frozen=True)
class PlainJsonParser:
    """Whole-reply JSON calls."""

    name: str = "json"
    special_tokens: bool = False

    def parse(self, text: str, final: bool, tools: list[dict[str, Any]]) -> ToolParse:
        if not final:
            return ToolParse(None)
        calls = _calls(text.strip(), {t["function"]["name"] for t in tools})
        return ToolParse(None, calls) if calls else ToolParse(text)


def _calls(text: str, names: set[str]) -> Optional[list[ParsedCall]]:
    value = _json(text)
    if value is None:
        blocks = [_json(b) for b in _BLOCK.findall(text)]
        value = blocks if blocks and _BLOCK.sub("", text).strip() == "" else None
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            args = _json(args)
        if not isinstance(args, dict):
            return None
        calls.append(ParsedCall(item["name"], json.dumps(args, ensure_ascii=False), True))
    return calls or None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
