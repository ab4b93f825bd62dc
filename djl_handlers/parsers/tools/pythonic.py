"""Pythonic calls (vLLM's ``pythonic``: Llama 3.2/4 and others): the whole reply is a Python list
of calls with keyword arguments, ``[get_weather(city="Paris"), get_time()]``.

Arguments are Python literals, returned as JSON. A call is known only once its parentheses close,
so a stream sends each call whole; a reply that is not such a list is content.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any, Optional

from djl_handlers.parsers.tools.base import ParsedCall, ToolParse

__all__ = ["PythonicParser"]


@dataclass(frozen=True)
class PythonicParser:
    """A Python list of calls."""

    name: str = "pythonic"
    special_tokens: bool = False

    def parse(self, text: str, final: bool, tools: list[dict[str, Any]]) -> ToolParse:
        head = text.lstrip()
        if not head.startswith("["):
            return ToolParse(text if (final or head) else None)
        if final:
            calls = _calls(head.rstrip())
            return ToolParse(None, calls) if calls else ToolParse(text)
        return ToolParse(None, _closed_calls(head))


def _calls(text: str) -> Optional[list[ParsedCall]]:
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = [_call(node) for node in tree.elts]
    return None if any(c is None for c in calls) else [c for c in calls if c is not None]


def _call(node: ast.AST) -> Optional[ParsedCall]:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        if len(args) != len(node.keywords):
            return None
        return ParsedCall(node.func.id, json.dumps(args, ensure_ascii=False), True)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _closed_calls(text: str) -> list[ParsedCall]:
    """The calls of an open list whose parentheses have closed."""
    calls: list[ParsedCall] = []
    depth, start, quote, i = 0, 1, "", 1
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0 and c == ")":
                call = _calls("[" + text[start:i + 1].strip().lstrip(",").strip() + "]")
                if call is None:
                    return calls
                calls.extend(call)
                start = i + 1
            elif depth < 0:
                break
        i += 1
    return calls
