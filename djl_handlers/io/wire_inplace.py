"""DJL's socket protocol parsed in place from a buffer (``struct.unpack_from``, no stream object).

The fast paths of :mod:`.wire`: the worker's per-step request frame when it is already in the
socket reader's buffer, the front end's per-step reply frame on the event loop, and each rolling
record. Same checks and messages as :mod:`.wire`'s field-by-field reader; a buffer that ends before
the frame does raises :class:`Incomplete` internally, returned as ``None`` by the parse functions.
"""

from __future__ import annotations

import struct

__all__ = ["Incomplete", "parse_input", "parse_output", "text_at"]

_SHORT = struct.Struct(">h")
_INT = struct.Struct(">i")

Content = list[tuple[str | None, bytes]]


class Incomplete(Exception):
    """The buffer ends before the frame does."""


def _field_at(buffer: bytes, pos: int, limit: int, what: str) -> tuple[bytes | None, int]:
    """The length-prefixed field at ``pos`` (``None`` for length -1) and the offset after it."""
    if pos + 4 > len(buffer):
        raise Incomplete
    size: int = _INT.unpack_from(buffer, pos)[0]
    pos += 4
    if size < 0:
        if size == -1:
            return None, pos
        raise ValueError(f"corrupt frame: negative {what} length {size}")
    if size > limit:
        raise ValueError(f"corrupt frame: {what} length {size} exceeds the limit of {limit} bytes")
    end = pos + size
    if end > len(buffer):
        raise Incomplete
    return buffer[pos:end], end


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"corrupt frame: {what} is not valid UTF-8") from exc


def _short_at(buffer: bytes, pos: int) -> int:
    if pos + 2 > len(buffer):
        raise Incomplete
    value: int = _SHORT.unpack_from(buffer, pos)[0]
    return value


def _pairs_at(buffer: bytes, pos: int, limit: int, what: str) -> tuple[dict[str, str], int]:
    count = _short_at(buffer, pos)
    pos += 2
    if count < 0:
        raise ValueError(f"corrupt frame: negative {what} count {count}")
    result: dict[str, str] = {}
    key_what, value_what = f"{what} key", f"{what} value"
    for _ in range(count):
        raw, pos = _field_at(buffer, pos, limit, key_what)
        if raw is None:
            raise ValueError(f"corrupt frame: null {what} key")
        key = _text(raw, key_what)
        raw, pos = _field_at(buffer, pos, limit, value_what)
        result[key] = "" if raw is None else _text(raw, value_what)
    return result, pos


def _entries_at(buffer: bytes, pos: int, limit: int, count: int) -> tuple[list[tuple[str | None, bytes]], int]:
    content: list[tuple[str | None, bytes]] = []
    for _ in range(count):
        raw, pos = _field_at(buffer, pos, limit, "content key")
        name = None if raw is None else _text(raw, "content key")
        raw, pos = _field_at(buffer, pos, limit, "content value")
        content.append((name, raw or b""))
    return content, pos


def parse_input(buffer: bytes, limit: int) -> tuple[dict[str, str], list[tuple[str | None, bytes]], int] | None:
    """The request frame at the start of ``buffer`` and its size; ``None`` when incomplete."""
    try:
        properties, pos = _pairs_at(buffer, 0, limit, "property")
        count = _short_at(buffer, pos)
        if count < 0:
            raise ValueError(f"corrupt frame: negative content count {count}")
        content, pos = _entries_at(buffer, pos + 2, limit, count)
    except Incomplete:
        return None
    return properties, content, pos


def parse_output(buffer: bytes, limit: int) -> tuple[int, str, dict[str, str], Content | None, int] | None:
    """``(code, message, properties, content, size)`` of the reply frame at the start of ``buffer``;
    ``content`` is ``None`` for a streamed reply (whose chunks are not parsed here); ``None`` when
    incomplete."""
    try:
        code = _short_at(buffer, 0)
        raw, pos = _field_at(buffer, 2, limit, "message")
        message = "" if raw is None else _text(raw, "message")
        properties, pos = _pairs_at(buffer, pos, limit, "property")
        count = _short_at(buffer, pos)
        if count == -1:
            return code, message, properties, None, pos + 2
        if count < 0:
            raise ValueError(f"corrupt frame: content count {count}")
        content, pos = _entries_at(buffer, pos + 2, limit, count)
    except Incomplete:
        return None
    return code, message, properties, content, pos


def text_at(data: bytes, pos: int, what: str) -> tuple[str, int]:
    """The non-null length-prefixed UTF-8 string at ``pos`` of ``data`` and the offset after it."""
    if pos + 4 > len(data):
        raise ValueError(f"truncated frame: {what} length ends after {len(data) - pos} bytes")
    size: int = _INT.unpack_from(data, pos)[0]
    pos += 4
    if size < 0:
        if size == -1:
            raise ValueError("corrupt record: null key or value")
        raise ValueError(f"corrupt frame: negative {what} length {size}")
    end = pos + size
    if end > len(data):
        raise ValueError(f"truncated frame: {what} needs {size} bytes, {len(data) - pos} left")
    try:
        return data[pos:end].decode("utf-8"), end
    except UnicodeDecodeError as exc:
        raise ValueError(f"corrupt frame: {what} is not valid UTF-8") from exc
