"""``Output``: a handler's response with the public API of ``djl_python.outputs.Output``.

A response is either complete (``content`` entries) or streaming (``stream_content``, an iterator
whose items become chunk records on the wire). :meth:`Output.send` writes it with the wire codec.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from djl_handlers.io import wire
from djl_handlers.io.pair_list import PairList

__all__ = ["Output", "default_stream_output_formatter", "encode_json"]

_LOG = logging.getLogger(__name__)

StreamFormatter = Callable[[Any], Any]


class _JSONEncoder(json.JSONEncoder):
    """JSON encoder that also accepts datetimes (as ``str``) and numpy scalars/arrays."""

    def default(self, o: Any) -> Any:
        """Convert datetime and numpy values; anything else is a ``TypeError`` as usual."""
        import datetime

        if isinstance(o, datetime.datetime):
            return str(o)
        converted = _from_numpy(o)
        if converted is not o:
            return converted
        return super().default(o)


def _from_numpy(value: Any) -> Any:
    """numpy integer/floating/ndarray -> Python value; ``value`` itself when not numpy."""
    if type(value).__module__ != "numpy":
        return value
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy made the object, so it is importable
        return value
    if isinstance(value, numpy.integer):
        return int(value)
    if isinstance(value, numpy.floating):
        return float(value)
    if isinstance(value, numpy.ndarray):
        return value.tolist()
    return value


def encode_json(value: Any) -> bytearray:
    """DJL's body encoding: ``ensure_ascii=False, allow_nan=False, indent=2, separators=(",", ":")``."""
    text = json.dumps(
        value, ensure_ascii=False, allow_nan=False, indent=2, cls=_JSONEncoder, separators=(",", ":")
    )
    return bytearray(text.encode("utf-8"))


def default_stream_output_formatter(item: Any) -> bytearray:
    """DJL's default stream formatter: one ``{"outputs": item}`` JSON line (``json.dumps`` defaults)."""
    return bytearray((json.dumps({"outputs": item}) + "\n").encode("utf-8"))


def _to_chunk_bytes(item: Any) -> bytes:
    """Stream item -> bytes: ``str`` as UTF-8, bytes-like as is, anything else as DJL JSON."""
    if type(item) is str:
        return item.encode("utf-8")
    if type(item) in (bytes, bytearray):
        return bytes(item)
    return bytes(encode_json(item))


class Output:
    """A response message (status, properties, content or a stream)."""

    def __init__(self, code: int = 200, message: str = "OK") -> None:
        """An empty ``200 OK`` response unless told otherwise."""
        self.code = code
        self.message = message
        self.properties: dict[str, Any] = {}
        self.content: PairList = PairList()
        self.stream_content: Iterable[Any] | None = None
        self.stream_output_formatter: StreamFormatter | None = None
        self.finalize_function: Callable[..., Any] | None = None
        self.finalize_args: tuple[Any, ...] = ()

    def __str__(self) -> str:
        """Indented JSON with code, message, properties and the Python type of each content value."""
        content = {
            self.content.key_at(i): f"type: {type(self.content.value_at(i))}"
            for i in range(self.content.size())
        }
        summary = {
            "code": self.code,
            "message": self.message,
            "properties": self.properties,
            "content": content,
        }
        return json.dumps(summary, indent=2, default=str)

    # ------------------------------------------------------------------------ status, headers

    def set_code(self, code: int) -> Output:
        """Set the status code; chainable."""
        self.code = code
        return self

    def set_message(self, message: str) -> Output:
        """Set the status message; chainable."""
        self.message = message
        return self

    def add_property(self, key: str, val: Any) -> Output:
        """Set a response property (an HTTP header, or ``batch_{i}_<name>`` for request i); chainable."""
        self.properties[key] = val
        return self

    def get_properties(self) -> dict[str, Any]:
        """The property dict (not a copy)."""
        return self.properties

    def get_property(self, key: str) -> Any:
        """Exact-case property lookup; ``None`` when absent."""
        return self.properties.get(key)

    def error(self, error: str, code: int = 424, message: str = "prediction failure") -> Output:
        """Turn this into an error response with JSON body ``{"code", "message", "error"}``."""
        self.code = code
        self.message = message
        self.add_property("content-type", "application/json")
        self.add_as_json({"code": code, "message": message, "error": error})
        return self

    # ------------------------------------------------------------------------------- content

    def add(self, value: Any, key: Any = None, batch_index: int | None = None) -> Output:
        """Append a content entry: ``str`` as UTF-8 ``bytes``, ``bytes``/``bytearray`` as a
        ``bytearray``, anything else as DJL JSON (the value types djl_python stores).

        ``batch_index`` turns the key into ``batch_{i}.{key}``, the dynamic-batch response key.
        """
        if key is not None and not isinstance(key, str):
            _LOG.warning("Output key should be str type, got %s", type(key))
            key = str(key)
        if batch_index is not None:
            key = f"batch_{batch_index}.{'' if key is None else key}"
        if type(value) is str:
            self.content.add(key=key, value=value.encode("utf-8"))
        elif type(value) is bytearray:
            self.content.add(key=key, value=value)
        elif type(value) is bytes:
            self.content.add(key=key, value=bytearray(value))
        else:
            self.content.add(key=key, value=encode_json(value))
        return self

    def add_as_json(self, val: Any, key: Any = None, batch_index: int | None = None) -> Output:
        """Append ``val`` encoded as DJL's pretty-printed JSON."""
        return self.add(encode_json(val), key=key, batch_index=batch_index)

    def add_as_numpy(self, np_list: Any, key: Any = None, batch_index: int | None = None) -> Output:
        """Append a list of arrays (or one array) as a DJL NDList, ``tensor/ndlist`` (needs numpy)."""
        from djl_handlers.io.ndlist import to_nd_list

        return self.add(to_nd_list(np_list), key=key, batch_index=batch_index)

    def add_as_string(self, val: str, key: Any = None, batch_index: int | None = None) -> Output:
        """Append ``val`` as UTF-8 (beyond djl_python, whose ``encode_decode.encode`` calls it for CSV)."""
        return self.add(str(val), key=key, batch_index=batch_index)

    def add_as_npz(self, np_list: list[Any], key: Any = None, batch_index: int | None = None) -> Output:
        """Append a list of arrays as a numpy ``.npz`` archive (needs numpy)."""
        import io

        import numpy

        buffer = io.BytesIO()
        numpy.savez(buffer, *np_list)
        return self.add(buffer.getvalue(), key=key, batch_index=batch_index)

    def add_stream_content(
        self,
        stream_content: Iterable[Any],
        output_formatter: StreamFormatter | None = default_stream_output_formatter,
    ) -> Output:
        """Switch to streaming: every item of ``stream_content`` (after ``output_formatter``) is one chunk.

        Pass ``output_formatter=None`` to send the items unformatted.
        """
        self.stream_content = stream_content
        self.stream_output_formatter = output_formatter
        return self

    # ------------------------------------------------------------------------------- encoding

    # djl_python's private names, called by DJL's own tools (test_model.py) and by user code.
    _encode_json = staticmethod(encode_json)
    _default_stream_output_formatter = staticmethod(default_stream_output_formatter)

    @staticmethod
    def binary_encode(data: dict[str, Any]) -> bytearray:
        """A rolling-batch record: short K, K x (utf8 key, utf8 ``str(value)``)."""
        return bytearray(wire.binary_encode(data))

    @staticmethod
    def write_utf8(msg: bytearray, val: str | None) -> None:
        """Append ``val`` as an int32-length-prefixed UTF-8 string (-1 for ``None``) to ``msg``."""
        msg += wire.encode_utf8(val)

    def finalize(self, function: Callable[..., Any], *args: Any) -> Output:
        """Register a callback the engine runs after the response was sent; chainable."""
        self.finalize_function = function
        self.finalize_args = args
        return self

    def execute_finalize(self) -> Any:
        """Run the registered callback and return its result (``None`` when there is none)."""
        if self.finalize_function is None:
            return None
        return self.finalize_function(*self.finalize_args)

    def _wire_properties(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.properties.items()}

    def iter_frames(self) -> Iterator[bytes]:
        """The response as wire byte strings: one frame, or a stream header then one per chunk.

        A stream whose iterator (or formatter) raises ends with a last chunk carrying the error text.
        """
        properties = self._wire_properties()
        if self.stream_content is None:
            entries = [
                (self.content.key_at(i), bytes(self.content.value_at(i))) for i in range(self.content.size())
            ]
            yield wire.encode_output_frame(self.code, self.message, properties, entries)
            return
        yield wire.encode_stream_header(self.code, self.message, properties)
        try:
            for item in self.stream_content:
                if self.stream_output_formatter is not None:
                    item = self.stream_output_formatter(item)
                yield wire.encode_stream_chunk(_to_chunk_bytes(item), True)
        except Exception as exc:  # the error text becomes the stream's tail
            _LOG.exception("Failed to read streaming content from output")
            yield wire.encode_stream_chunk(str(exc).encode("utf-8"), False)
            return
        yield wire.encode_stream_chunk(b"", False)

    def send(self, cl_socket: Any) -> None:
        """Write the response to a socket-like object (``sendall``) or a binary stream (``write``)."""
        write = getattr(cl_socket, "sendall", None) or cl_socket.write
        for frame in self.iter_frames():
            write(frame)
