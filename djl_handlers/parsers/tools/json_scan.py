"""Scanning JSON that may still be growing: where a value ends, and the fields of a call object.

``value_end`` finds the end of the value at an index (None: not complete yet; ``Malformed``: it
can never be JSON). ``scan_call`` reads ``{"name": ..., "arguments": {...}}`` (or
``"parameters"``) as far as the text goes, the arguments as the model wrote them.
"""

from __future__ import annotations

import json
import re
from typing import Optional

from djl_handlers.parsers.tools.base import ParsedCall

__all__ = ["Malformed", "scan_call", "skip_space", "value_end"]

_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
_SCALAR_START = set("-0123456789tfn")
ARGUMENT_KEYS = ("arguments", "parameters")


class Malformed(ValueError):
    """The text can never become the JSON expected there."""


def skip_space(text: str, i: int) -> int:
    """The first index at or after ``i`` that is not JSON whitespace."""
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _string_end(text: str, i: int) -> Optional[int]:
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def _container_end(text: str, i: int) -> Optional[int]:
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == '"':
            end = _string_end(text, j)
            if end is None:
                return None
            j = end
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def value_end(text: str, i: int) -> Optional[int]:
    """The index just after the JSON value starting at ``text[i]``; None while it may grow."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c in "{[":
        return _container_end(text, i)
    if c in _SCALAR_START:
        match = _SCALAR.match(text, i)
        if match is None:
            if any(w.startswith(text[i:]) for w in ("true", "false", "null")):
                return None
            raise Malformed(f"not JSON at {i}")
        return match.end() if match.end() < len(text) else None
    raise Malformed(f"not JSON at {i}")


def scan_call(text: str, i: int) -> tuple[Optional[ParsedCall], Optional[int]]:
    """The call object at ``text[i]`` (``{``) read so far, and the index after it (None while it is
    open). The call is None until its name is complete; its arguments are the raw text of the
    ``arguments``/``parameters`` value so far (a string value counts once complete)."""
    fields: dict[str, tuple[int, Optional[int]]] = {}
    end = _scan_fields(text, i, fields)
    name_span = fields.get("name")
    if name_span is None or name_span[1] is None:
        return None, end
    name = json.loads(text[name_span[0]:name_span[1]])
    if not isinstance(name, str):
        raise Malformed("the call's name is not a string")
    call = ParsedCall(name)
    key = next((k for k in ARGUMENT_KEYS if k in fields), None)
    if key is not None:
        start, stop = fields[key]
        raw = text[start:stop] if stop is not None else text[start:]
        if raw.startswith('"'):
            raw = json.loads(raw) if stop is not None else ""
        call.arguments, call.complete = raw, stop is not None
    elif end is not None:
        call.arguments, call.complete = "{}", True
    return call, end


def _scan_fields(text: str, i: int, fields: dict[str, tuple[int, Optional[int]]]) -> Optional[int]:
    """Fill ``fields`` with each top-level key's value span; the object's end or None."""
    if text[i] != "{":
        raise Malformed("a call must be a JSON object")
    j = skip_space(text, i + 1)
    if j < len(text) and text[j] == "}":
        return j + 1
    while j < len(text):
        j = _field(text, j, fields)
        if j < 0:
            return None
        if text[j] == "}":
            return j + 1
        if text[j] != ",":
            raise Malformed("expected ',' or '}'")
        j = skip_space(text, j + 1)
    return None


def _field(text: str, j: int, fields: dict[str, tuple[int, Optional[int]]]) -> int:
    """Read the ``"key": value`` at ``j`` into ``fields``; the index after it (past blanks), or -1
    when the text ends first."""
    if text[j] != '"':
        raise Malformed("expected a key")
    key_end = _string_end(text, j)
    if key_end is None:
        return -1
    key = json.loads(text[j:key_end])
    j = skip_space(text, key_end)
    if j >= len(text):
        return -1
    if text[j] != ":":
        raise Malformed("expected ':'")
    j = skip_space(text, j + 1)
    if j >= len(text):
        return -1
    stop = value_end(text, j)
    fields[key] = (j, stop)
    if stop is None:
        return -1
    j = skip_space(text, stop)
    return j if j < len(text) else -1
