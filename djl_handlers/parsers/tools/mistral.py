"""Mistral calls after ``[TOOL_CALLS]`` (a special token): the older JSON list
``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` and the v11 tokenizers' form
``[TOOL_CALLS]name{...}`` (or ``name[ARGS]{...}``), one marker per call.

The content is the text before the first marker (None when blank). A reply whose calls do not
parse is content, as vLLM's ``mistral`` parser reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from djl_handlers.parsers.markers import held_back
from djl_handlers.parsers.tools.base import ParsedCall, ToolParse
from djl_handlers.parsers.tools.json_scan import Malformed, scan_call, skip_space, value_end

__all__ = ["MistralParser"]

TAG, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")


@dataclass(frozen=True)
class MistralParser:
    """``[TOOL_CALLS]`` calls, both forms."""

    name: str = "mistral"
    special_tokens: bool = True

    def parse(self, text: str, final: bool, tools: list[dict[str, Any]]) -> ToolParse:
        first = text.find(TAG)
        if first < 0:
            return ToolParse(held_back(text, (TAG,), final) or None)
        content = text[:first] if text[:first].strip() else None
        calls: list[ParsedCall] = []
        try:
            body = skip_space(text, first + len(TAG))
            if body < len(text) and text[body] in "[{":
                done = self._json_list(text, body, calls)
            else:
                done = self._named(text, first, calls)
        except Malformed:
            return ToolParse(text) if final else ToolParse(content, calls)
        if final and (not done or not calls or any(not c.complete for c in calls)):
            return ToolParse(text)
        return ToolParse(content, calls)

    @staticmethod
    def _json_list(text: str, at: int, calls: list[ParsedCall]) -> bool:
        if text[at] == "{":
            call, end = scan_call(text, at)
            if call is not None:
                calls.append(call)
            return end is not None
        at = skip_space(text, at + 1)
        while at < len(text):
            call, end = scan_call(text, at)
            if call is not None:
                calls.append(call)
            if end is None:
                return False
            at = skip_space(text, end)
            if at < len(text) and text[at] == "]":
                return True
            if at < len(text) and text[at] != ",":
                raise Malformed("expected ',' between calls")
            at = skip_space(text, at + 1)
        return False

    @staticmethod
    def _named(text: str, at: int, calls: list[ParsedCall]) -> bool:
        while at >= 0:
            start = at + len(TAG)
            match = _NAME.match(text, start)
            if match is None:
                return False
            args_at = match.end()
            if text.startswith(ARGS, args_at):
                args_at += len(ARGS)
            elif args_at == len(text) or ARGS.startswith(text[args_at:]):
                return False  # the name may still grow
            args_at = skip_space(text, args_at)
            if args_at >= len(text):
                calls.append(ParsedCall(match.group()))
                return False
            if text[args_at] != "{":
                raise Malformed("a call's arguments must be an object")
            end = value_end(text, args_at)
            calls.append(ParsedCall(match.group(), text[args_at:end] if end else text[args_at:], end is not None))
            if end is None:
                return False
            at = text.find(TAG, end)
        return True
