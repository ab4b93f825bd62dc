"""What a tool-call parser returns, and the protocol every one of them follows."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

__all__ = ["ParsedCall", "ToolParse", "ToolParser", "normalized_arguments", "schema_of"]


@dataclass
class ParsedCall:
    """One call read so far: its ``name`` and the JSON text of its ``arguments`` (a prefix of the
    final text until ``complete``)."""

    name: str
    arguments: str = ""
    complete: bool = False


@dataclass
class ToolParse:
    """One reading of a reply: the ``content`` outside the calls (None: none) and the ``calls``."""

    content: Optional[str]
    calls: list[ParsedCall] = field(default_factory=list)


class ToolParser(Protocol):
    """Reads the calls of the text generated so far. With ``final`` false, text that may still
    become a call is held back, and a later reading's content and each call's arguments start
    with the earlier reading's. With ``final`` true a reply whose calls do not parse is content.
    ``special_tokens``: the format's markers are special tokens, so the request must keep them."""

    @property
    def name(self) -> str:
        """The parser's registered name."""
        ...

    @property
    def special_tokens(self) -> bool:
        """The format's markers are special tokens (the request keeps them in its text)."""
        ...

    def parse(self, text: str, final: bool, tools: list[dict[str, Any]]) -> ToolParse:
        """The content and calls of ``text``; ``tools`` as the request listed them."""
        ...


def normalized_arguments(arguments: str) -> str:
    """A complete call's arguments as compact-spaced JSON (``json.dumps``), as vLLM returns them."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        return arguments


def schema_of(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The ``parameters`` schema of function ``name`` among ``tools`` (empty when unknown)."""
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name and isinstance(fn.get("parameters"), dict):
            return fn["parameters"]
    return {}
