"""DJL Serving's binary socket protocol between the front end and a Python worker.

One implementation of the format for the whole project: ``Input.read``, ``Output.send``, the local
server and our worker all go through these functions. Layout (all integers big-endian):

* ``short`` = int16, ``int`` = int32;
* ``utf8(s)`` = ``int`` byte length then UTF-8 bytes, length -1 meaning ``None``;
* request frame: ``short`` N, N x (utf8 key, utf8 value), ``short`` M, M x (utf8 key or null,
  ``int`` length, raw bytes);
* response frame: ``short`` code, utf8 message, ``short`` P, P x (utf8 key, utf8 value), then either
  ``short`` C and C content entries as above, or ``short`` -1 followed by chunk records
  (``1 byte`` flag 1 = more / 0 = last, ``int`` length, bytes); a last chunk with data carries the
  error text of a failed stream;
* rolling-batch record: ``short`` K, K x (utf8 key, utf8 ``str(value)``).

Readers raise ``EOFError`` when the stream ends cleanly before a frame starts and ``ValueError`` for a
corrupt or truncated frame, including a length field larger than :func:`max_frame_bytes`.
See ``docs/wire-format.md`` for worked hex examples.
Buffers that already hold a whole frame are parsed in place by :mod:`.wire_inplace` (same checks).
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from djl_handlers.io import wire_inplace
from djl_handlers.io.wire_inplace import Incomplete

__all__ = [
    "MAX_FRAME_BYTES",
    "OutputFrame",
    "binary_decode",
    "binary_encode",
    "encode_input_frame",
    "encode_output_frame",
    "encode_stream_chunk",
    "encode_stream_header",
    "encode_utf8",
    "max_frame_bytes",
    "parse_output_frame",
    "read_input_frame",
    "read_output_frame",
]

MAX_FRAME_BYTES: int = 20 * 1024 * 1024
"""Default limit for one length field (DJL's ``MAX_NETTY_BUFFER_SIZE``, 20 MiB)."""

_ENV_LIMIT = "MAX_NETTY_BUFFER_SIZE"
_SHORT = struct.Struct(">h")
_INT = struct.Struct(">i")
_SHORT_MAX = 32767

Content = Sequence[tuple[str | None, bytes]]


class _Readable(Protocol):
    """Anything with a ``read(n)`` method (files, ``BytesIO``, socket files, our adapters)."""

    def read(self, n: int = -1, /) -> bytes | None:
        """Read up to ``n`` bytes."""
        ...


def max_frame_bytes() -> int:
    """The largest accepted length field: env ``MAX_NETTY_BUFFER_SIZE`` if set to an int, else 20 MiB."""
    raw = os.environ.get(_ENV_LIMIT, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            return MAX_FRAME_BYTES
        if value > 0:
            return value
    return MAX_FRAME_BYTES


# --------------------------------------------------------------------------------------------------
# primitive writers


def _short(value: int, what: str) -> bytes:
    if not -32768 <= value <= _SHORT_MAX:
        raise ValueError(f"{what} {value} does not fit a signed 16-bit field")
    return _SHORT.pack(value)


def encode_utf8(value: str | None) -> bytes:
    """``utf8(s)``: int32 byte length then the UTF-8 bytes; ``None`` is length -1."""
    if value is None:
        return _INT.pack(-1)
    data = value.encode("utf-8")
    return _INT.pack(len(data)) + data


def _blob(value: bytes | bytearray | memoryview) -> bytes:
    return _INT.pack(len(value)) + bytes(value)


def _pairs(properties: Mapping[str, str], what: str) -> bytes:
    parts = [_short(len(properties), f"{what} count")]
    for key, value in properties.items():
        parts.append(encode_utf8(key))
        parts.append(encode_utf8(value))
    return b"".join(parts)


def _content(content: Content) -> bytes:
    parts = [_short(len(content), "content count")]
    for key, value in content:
        parts.append(encode_utf8(key))
        parts.append(_blob(value))
    return b"".join(parts)


def _head(code: int, message: str, properties: Mapping[str, str]) -> bytes:
    return _short(code, "status code") + encode_utf8(message) + _pairs(properties, "property")


# --------------------------------------------------------------------------------------------------
# encoders


def encode_input_frame(properties: Mapping[str, str], content: Content) -> bytes:
    """A request frame (front end -> worker) with the given properties and content entries."""
    return _pairs(properties, "property") + _content(content)


def encode_output_frame(code: int, message: str, properties: Mapping[str, str], content: Content) -> bytes:
    """A complete non-streaming response frame (worker -> front end)."""
    return _head(code, message, properties) + _content(content)


def encode_stream_header(code: int, message: str, properties: Mapping[str, str]) -> bytes:
    """The head of a streaming response: like :func:`encode_output_frame` with content count -1."""
    return _head(code, message, properties) + _SHORT.pack(-1)


def encode_stream_chunk(data: bytes, more: bool) -> bytes:
    """One chunk record: flag byte (1 = more follow, 0 = last), int length, bytes."""
    return (b"\x01" if more else b"\x00") + _blob(data)


def binary_encode(record: Mapping[str, object]) -> bytes:
    """A rolling-batch per-request record: short K, K x (utf8 key, utf8 ``str(value)``).

    Values go through ``str()`` exactly as DJL does, so ``True`` travels as ``"True"`` and ``424``
    as ``"424"``.
    """
    parts = [_short(len(record), "record entry count")]
    for key, value in record.items():
        parts.append(encode_utf8(str(key)))
        parts.append(encode_utf8(str(value)))
    return b"".join(parts)


# --------------------------------------------------------------------------------------------------
# readers


class _Reader:
    """Reads exact byte counts from a stream; EOF before the first byte of a frame is ``EOFError``."""

    def __init__(self, stream: _Readable) -> None:
        self._stream = stream
        self.consumed = 0
        self._limit = max_frame_bytes()  # read once per frame, not per length field

    def exact(self, n: int) -> bytes:
        """Exactly ``n`` bytes; a short read is a truncated frame (or a clean EOF at offset 0)."""
        chunks: list[bytes] = []
        left = n
        while left > 0:
            piece = self._stream.read(left)
            if not piece:
                if self.consumed == 0 and left == n:
                    raise EOFError("end of stream")
                raise ValueError(f"truncated frame: needed {n} bytes, stream ended after {n - left}")
            chunks.append(piece)
            left -= len(piece)
            self.consumed += len(piece)
        return b"".join(chunks)

    def short(self) -> int:
        """A signed 16-bit integer."""
        value: int = _SHORT.unpack(self.exact(2))[0]
        return value

    def int32(self) -> int:
        """A signed 32-bit integer."""
        value: int = _INT.unpack(self.exact(4))[0]
        return value

    def length(self, what: str) -> int:
        """A length field; -1 (null) is returned as is, other negatives and oversize ones are errors."""
        value = self.int32()
        if value < -1:
            raise ValueError(f"corrupt frame: negative {what} length {value}")
        limit = self._limit
        if value > limit:
            raise ValueError(f"corrupt frame: {what} length {value} exceeds the limit of {limit} bytes")
        return value

    def utf8(self, what: str) -> str | None:
        """A length-prefixed UTF-8 string or ``None``."""
        size = self.length(what)
        if size < 0:
            return None
        try:
            return self.exact(size).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"corrupt frame: {what} is not valid UTF-8") from exc

    def count(self, what: str) -> int:
        """A non-negative short count."""
        value = self.short()
        if value < 0:
            raise ValueError(f"corrupt frame: negative {what} count {value}")
        return value

    def pairs(self, what: str) -> dict[str, str]:
        """Properties: short count, then utf8 key/value pairs. A null value reads as ``""``."""
        result: dict[str, str] = {}
        for _ in range(self.count(what)):
            key = self.utf8(f"{what} key")
            if key is None:
                raise ValueError(f"corrupt frame: null {what} key")
            value = self.utf8(f"{what} value")
            result[key] = "" if value is None else value
        return result

    def entries(self, count: int) -> list[tuple[str | None, bytes]]:
        """``count`` content entries: utf8 key (may be null), int length, raw bytes."""
        result: list[tuple[str | None, bytes]] = []
        for _ in range(count):
            key = self.utf8("content key")
            size = self.length("content value")
            result.append((key, self.exact(size) if size > 0 else b""))
        return result


def read_input_frame(stream: BinaryIO) -> tuple[dict[str, str], list[tuple[str | None, bytes]]]:
    """Read one request frame; ``EOFError`` at a clean end of stream, ``ValueError`` if corrupt.

    A buffered stream (``peek``, e.g. a socket's ``makefile("rb")``) that already holds the whole
    frame is parsed in place (the worker reads one frame per rolling step); otherwise, and for a
    frame larger than the buffer, field by field."""
    peek = getattr(stream, "peek", None)
    if peek is not None:
        buffered = peek(1)
        if buffered:
            parsed = wire_inplace.parse_input(buffered, max_frame_bytes())
            if parsed is not None:
                stream.read(parsed[2])
                return parsed[0], parsed[1]
    reader = _Reader(stream)
    properties = reader.pairs("property")
    content = reader.entries(reader.count("content"))
    return properties, content


@dataclass
class OutputFrame:
    """A decoded response frame.

    Exactly one of ``content`` (non-streaming) and ``chunks`` (streaming) is set. ``chunks`` yields
    ``(data, more)`` pairs read lazily from the stream; the last has ``more=False`` and its data, when
    non-empty, is the error text of a stream that failed.
    """

    code: int
    message: str
    properties: dict[str, str]
    content: list[tuple[str | None, bytes]] | None = None
    chunks: Iterator[tuple[bytes, bool]] | None = None


def _iter_chunks(reader: _Reader) -> Iterator[tuple[bytes, bool]]:
    while True:
        flag = reader.exact(1)[0]
        if flag not in (0, 1):
            raise ValueError(f"corrupt frame: chunk flag {flag} is neither 0 nor 1")
        size = reader.length("chunk")
        data = reader.exact(size) if size > 0 else b""
        yield data, flag == 1
        if flag == 0:
            return


def read_output_frame(stream: BinaryIO) -> OutputFrame:
    """Read one response frame; the chunks of a streaming one are read as they are iterated."""
    return _read_output(_Reader(stream))


def _read_output(reader: _Reader) -> OutputFrame:
    code = reader.short()
    message = reader.utf8("message")
    properties = reader.pairs("property")
    count = reader.short()
    frame = OutputFrame(code=code, message=message or "", properties=properties)
    if count == -1:
        frame.chunks = _iter_chunks(reader)
    elif count < 0:
        raise ValueError(f"corrupt frame: content count {count}")
    else:
        frame.content = reader.entries(count)
    return frame


class _BufferReader(_Reader):
    """A :class:`_Reader` over a complete buffer that says *incomplete* instead of *truncated*."""

    def exact(self, n: int) -> bytes:
        """Exactly ``n`` bytes, or :class:`.wire_inplace.Incomplete`."""
        piece = self._stream.read(n) or b""
        if len(piece) < n:
            raise Incomplete
        self.consumed += n
        return piece


def parse_output_frame(buffer: bytes) -> tuple[OutputFrame, int] | None:
    """The response frame at the start of ``buffer`` and its size in bytes, or ``None`` while the
    buffer holds only part of it (for a reader that receives bytes as they come, e.g. on an event
    loop). A streamed reply's chunks are read eagerly, so ``chunks`` iterates over a list.
    ``ValueError`` for a corrupt frame, as :func:`read_output_frame`. Parsed in place
    (:mod:`.wire_inplace`; the front end reads one per rolling step)."""
    try:
        parsed = wire_inplace.parse_output(buffer, max_frame_bytes())
        if parsed is None:
            return None
        code, message, properties, content, size = parsed
        if content is None:  # streamed (rare on this path): the stream reader, over the whole buffer
            reader = _BufferReader(io.BytesIO(buffer))
            frame = _read_output(reader)
            frame.chunks = iter(list(frame.chunks or ()))
            return frame, reader.consumed
    except Incomplete:
        return None
    return OutputFrame(code=code, message=message, properties=properties, content=content), size


def binary_decode(data: bytes) -> dict[str, str]:
    """Inverse of :func:`binary_encode`; ``ValueError`` for truncated, trailing or null fields.

    Parsed in place with ``unpack_from`` (the front end decodes one record per request per step);
    a field cannot be longer than the record, which the frame holding it already bounded."""
    if not data:
        raise ValueError("corrupt record: empty")
    if len(data) < 2:
        raise ValueError("truncated frame: record entry count needs 2 bytes, 1 left")
    count: int = _SHORT.unpack_from(data, 0)[0]
    if count < 0:
        raise ValueError(f"corrupt frame: negative record entry count {count}")
    result: dict[str, str] = {}
    pos = 2
    for _ in range(count):
        key, pos = wire_inplace.text_at(data, pos, "record key")
        value, pos = wire_inplace.text_at(data, pos, "record value")
        result[key] = value
    if pos != len(data):
        raise ValueError(f"corrupt record: trailing bytes after {pos} bytes")
    return result
