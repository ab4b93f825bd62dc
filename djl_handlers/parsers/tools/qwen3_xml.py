"""Qwen3-Coder's XML calls (vLLM's ``qwen3_xml`` and ``qwen3_coder``)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Each parameter's text (one leading and trailing newline removed) is converted by the function's
JSON Schema: strings stay text, numbers, booleans, objects and arrays are read as JSON (as a
Python literal when that fails). A call is sent once its ``</function>`` is there. The content
is the text before the first ``<tool_call>`` less its trailing line breaks (None when empty).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from djl_handlers.parsers.markers import held_back
from djl_handlers.parsers.tools.base import ParsedCall, ToolParse, schema_of

__all__ = ["Qwen3XmlParser"]

START = "<tool_call>"
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)


@dataclass(frozen=True)
class Qwen3XmlParser:
    """``<function=...>`` XML calls."""

    name: str = "qwen3_xml"
    special_tokens: bool = False

    def parse(self, text: str, final: bool, tools: list[dict[str, Any]]) -> ToolParse:
        first = text.find(START)
        opened = text.find("<function=")
        first = first if first >= 0 else opened
        if first < 0:
            return ToolParse(held_back(text, (START, "<function="), final) or None)
        calls = [ParsedCall(m.group(1).strip(), _arguments(m.group(2), schema_of(tools, m.group(1).strip())), True)
                 for m in _FUNCTION.finditer(text, first)]
        if final and not calls:
            return ToolParse(text)
        return ToolParse(text[:first].rstrip("\n") or None, calls)


def _arguments(body: str, schema: dict[str, Any]) -> str:
    found = schema.get("properties")
    properties: dict[str, Any] = found if isinstance(found, dict) else {}
    args = {}
    for match in _PARAMETER.finditer(body):
        name = match.group(1).strip()
        value = match.group(2)
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        args[name] = _convert(value, properties.get(name) or {})
    return json.dumps(args, ensure_ascii=False)


def _convert(value: str, schema: dict[str, Any]) -> Any:
    kind = schema.get("type", "string") if isinstance(schema, dict) else "string"
    kinds = kind if isinstance(kind, list) else [kind]
    if value.lower() == "null" and "string" not in kinds:
        return None
    if kinds == ["string"] or "string" in kinds and len(kinds) == 1:
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError, RecursionError):
            return value
    if "integer" in kinds and isinstance(parsed, float) and parsed.is_integer():
        return int(parsed)
    return parsed
