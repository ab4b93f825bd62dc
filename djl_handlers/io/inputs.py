"""``Input``: one request message as DJL Serving hands it to a Python handler (djl_python's API).

Properties are the HTTP headers plus front-end settings (``handler``, ``batch_size``...); content
entries are the body (key ``data``) and query parameters. A dynamic or rolling batch arrives as one
``Input`` whose keys carry a ``batch_NNN.`` prefix; :meth:`Input.get_batches` splits it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, cast

from djl_handlers.io import wire
from djl_handlers.io.pair_list import PairList

__all__ = ["Input"]

_BATCH_PREFIX = "batch_"
_MAX_BATCH = 1000


class _SocketReader:
    """Gives a socket-like object with ``recv`` the ``read(n)`` method the wire codec uses."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def read(self, n: int = -1, /) -> bytes:
        """Up to ``n`` bytes from ``recv`` (``b""`` at end of stream)."""
        data: bytes = self._conn.recv(n)
        return data


def _split_batch_key(key: object, batch_size: int) -> tuple[int, str]:
    """``batch_007.data`` -> ``(7, "data")``; the separator character (``.`` or ``_``) is not checked."""
    if not isinstance(key, str) or not key.startswith(_BATCH_PREFIX):
        raise ValueError(f"batch key {key!r} does not start with 'batch_'")
    digits = key[6:9]
    if len(digits) != 3 or not digits.isdigit():
        raise ValueError(f"batch key {key!r} lacks a 3-digit index after 'batch_'")
    index = int(digits)
    if index >= batch_size:
        raise ValueError(f"batch key {key!r} has index {index} outside batch_size {batch_size}")
    return index, key[10:]


class Input:
    """A request message with the public API of ``djl_python.inputs.Input``."""

    def __init__(self) -> None:
        """An empty message: no function name, no properties, no content."""
        self.function_name: str | None = None
        self.properties: dict[str, str] = {}
        self.content: PairList = PairList()

    @classmethod
    def from_parts(
        cls,
        properties: Mapping[str, str] | None = None,
        content: Sequence[tuple[str | None, bytes | bytearray]] = (),
    ) -> Input:
        """Build a message from properties and ``(key, bytes)`` content entries (beyond djl_python).

        ``function_name`` is taken from property ``handler`` as :meth:`read` does.
        """
        item = cls()
        item.properties = dict(properties or {})
        for key, value in content:
            item.content.add(key=key, value=bytearray(value))
        item.function_name = item.properties.get("handler")
        return item

    def __str__(self) -> str:
        """``properties: {...}`` then one ``key: get_data(key)`` line per content entry."""
        lines = [f"properties: {self.get_properties()}"]
        for key in self.get_content().get_keys():
            lines.append(f"{key}: {self.get_data(key)}")
        return "\n".join(lines)

    # ---------------------------------------------------------------------------------- batches

    def is_batch(self) -> bool:
        """True when the front end set property ``batch_size``."""
        return "batch_size" in self.properties

    def get_batch_size(self) -> int:
        """``int(batch_size)``, 1 when absent."""
        return int(self.properties.get("batch_size", "1"))

    def get_batches(self) -> list[Input]:
        """Split a batch message into one ``Input`` per request (``[self]`` when not a batch).

        Only ``batch_NNN?``-prefixed keys are distributed (prefix removed); other properties and
        ``batch_size`` itself are not copied. ``ValueError`` for a malformed or out-of-range key.
        """
        if not self.is_batch():
            return [self]
        size = self.get_batch_size()
        if not 0 <= size <= _MAX_BATCH:
            raise ValueError(f"batch_size {size} outside 0..{_MAX_BATCH}")
        batch = [Input() for _ in range(size)]
        for key, value in self.properties.items():
            if key.startswith(_BATCH_PREFIX) and key != "batch_size":
                index, sub_key = _split_batch_key(key, size)
                batch[index].properties[sub_key] = value
        for i in range(self.content.size()):
            index, sub_key = _split_batch_key(self.content.key_at(i), size)
            batch[index].content.add(sub_key, self.content.value_at(i))
        return batch

    # ------------------------------------------------------------------------------- accessors

    def get_function_name(self) -> str | None:
        """The handler function name (property ``handler`` of the frame)."""
        return self.function_name

    def get_properties(self) -> dict[str, str]:
        """The property dict (not a copy)."""
        return self.properties

    def get_content(self) -> PairList:
        """The content ``PairList`` (not a copy)."""
        return self.content

    def get_property(self, key: str) -> str | None:
        """Case-insensitive property lookup; ``None`` when absent."""
        wanted = key.lower()
        for name, value in self.properties.items():
            if name.lower() == wanted:
                return value
        return None

    def contains_key(self, key: str) -> bool:
        """True when a content entry has this key."""
        return self.content.get(key) is not None

    def is_empty(self) -> bool:
        """True when there is no content (the initialization / warm-up message)."""
        return self.content.is_empty()

    # ------------------------------------------------------------------------------ data views

    def get_data(self, key: str | None = None) -> Any:
        """Decode by property ``content-type``: JSON, text, image, npz/ndlist, else raw bytes."""
        content_type = self.get_property("content-type")
        if content_type == "tensor/ndlist":
            return self.get_as_numpy(key)
        if content_type == "tensor/npz":
            return self.get_as_npz(key)
        if content_type is not None and content_type.startswith("application/json"):
            return self.get_as_json(key)
        if content_type is not None and content_type.startswith("text/"):
            return self.get_as_string(key)
        if content_type is not None and content_type.startswith("image/"):
            return self.get_as_image(key)
        if self.content.is_empty():
            return None
        return self.get_as_bytes(key=key)

    def get_as_bytes(self, key: str | None = None) -> Any:
        """Raw value: of ``key`` (``KeyError`` if missing), else of ``data``, else the first entry.

        ``None`` when there is no content at all.
        """
        if self.content.is_empty():
            return None
        if key:
            value = self.content.get(key)
            if value is None:
                raise KeyError(f"requested data for key:{key} is not found!")
            return value
        value = self.content.get("data")
        return self.content.value_at(0) if value is None else value

    def get_as_string(self, key: str | None = None) -> str:
        """The value decoded as UTF-8."""
        return cast(str, self.get_as_bytes(key=key).decode("utf-8"))

    def get_as_json(self, key: str | None = None) -> Any:
        """The value parsed as JSON."""
        return json.loads(self.get_as_bytes(key=key).decode("utf-8"))

    def get_as_image(self, key: str | None = None) -> Any:
        """The value opened as a PIL image (needs Pillow)."""
        from PIL import Image

        return Image.open(io.BytesIO(self.get_as_bytes(key=key)))

    def get_as_numpy(self, key: str | None = None) -> list[Any]:
        """The value decoded as a DJL NDList (``tensor/ndlist``; also npz/npy): numpy arrays (needs numpy)."""
        from djl_handlers.io.ndlist import from_nd_list

        return from_nd_list(self.get_as_bytes(key=key))

    def get_as_npz(self, key: str | None = None) -> list[Any]:
        """The value loaded as a numpy ``.npz`` archive: arrays in file order (needs numpy)."""
        import numpy

        archive = numpy.load(io.BytesIO(self.get_as_bytes(key=key)))
        return [archive[name] for name in archive.files]

    def get_as_csv(self, key: str | None = None) -> list[dict[str, str]]:
        """The value parsed as CSV with a header row: one dict per row."""
        import csv

        return list(csv.DictReader(io.StringIO(self.get_as_string(key=key))))

    # -------------------------------------------------------------------------------- wire I/O

    def read(self, conn: Any) -> None:
        """Read one request frame from ``conn`` (a socket with ``recv`` or a stream with ``read``).

        Raises ``EOFError`` when the stream ends before a frame starts, ``ValueError`` when corrupt.
        """
        source = conn if hasattr(conn, "read") else _SocketReader(conn)
        properties, content = wire.read_input_frame(cast(BinaryIO, source))
        self.properties.update(properties)
        for key, value in content:
            self.content.add(key=key, value=bytearray(value))
        self.function_name = self.properties.get("handler")
