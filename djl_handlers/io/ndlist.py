"""DJL's ``tensor/ndlist`` payload: a list of tensors as bytes, written and read with numpy.

Our own codec for the format of DJL's Java ``NDList.encode()`` / ``NDSerializer`` (version 3), the
one djl_python's ``np_util.to_nd_list`` / ``from_nd_list`` speak. All integers are big-endian;
``utf(s)`` is Java's ``writeUTF``: an unsigned 16-bit byte length, then modified UTF-8.

* list: ``int`` N, then N arrays;
* array: ``utf("NDAR")``, ``int`` version (3), ``byte`` 1 + ``utf(name)`` or ``byte`` 0, ``utf``
  sparse format (ignored; we write ``default`` as djl_python does, Java writes ``DENSE``),
  ``utf`` data type (DJL's ``DataType`` name, e.g. ``FLOAT32``), shape (``int`` D, D x ``long``
  dims, ``int`` L, L x 2-byte layout chars, ``?`` each), then either for ``STRING`` ``int`` K and
  K x ``utf`` or for numbers ``byte`` ``<``/``>`` (byte order), ``int`` length, raw C-order data.

:func:`from_nd_list` also reads what Java's ``NDList.decode`` reads: an ``.npz`` archive (``PK``), a
single ``.npy`` array and a safetensors blob; and versions 1 and 2 of the array record. numpy is
imported only when one of these functions runs; pickled numpy data is never loaded.
"""

from __future__ import annotations

import io
import json
import math
import struct
from types import ModuleType
from typing import Any

__all__ = ["MAGIC_NUMBER", "VERSION", "from_nd_list", "to_nd_list"]

MAGIC_NUMBER = "NDAR"
VERSION = 3

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_USHORT = struct.Struct(">H")
_MAX_DIMS = 64
_UTF_MAX = 0xFFFF

# DJL DataType name -> numpy dtype name. "BOOL" is what djl_python writes for numpy bool.
_DJL_TO_NUMPY = {
    "FLOAT64": "float64", "FLOAT32": "float32", "FLOAT16": "float16",
    "INT64": "int64", "INT32": "int32", "INT16": "int16", "INT8": "int8",
    "UINT64": "uint64", "UINT32": "uint32", "UINT16": "uint16", "UINT8": "uint8",
    "BOOLEAN": "bool", "BOOL": "bool",
}  # fmt: skip
_NUMPY_TO_DJL = {v: k for k, v in _DJL_TO_NUMPY.items() if k != "BOOL"}
_SAFETENSORS_TO_NUMPY = {
    "F64": "float64", "F32": "float32", "F16": "float16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
    "BOOL": "bool",
}  # fmt: skip


def _numpy() -> ModuleType:
    try:
        import numpy
    except ImportError as exc:  # pragma: no cover - numpy is installed wherever tests run
        raise ImportError("tensor/ndlist payloads need numpy (pip install numpy)") from exc
    return numpy


# --------------------------------------------------------------------------- Java writeUTF


def _java_utf(text: str) -> bytes:
    """Java ``DataOutputStream.writeUTF``: NUL as ``C0 80``, non-BMP characters as two 3-byte surrogates."""
    units = text.encode("utf-16-be", "surrogatepass")
    out = bytearray()
    for (unit,) in struct.iter_unpack(">H", units):
        if 0 < unit < 0x80:
            out.append(unit)
        elif unit < 0x800:
            out += bytes((0xC0 | unit >> 6, 0x80 | unit & 0x3F))
        else:
            out += bytes((0xE0 | unit >> 12, 0x80 | unit >> 6 & 0x3F, 0x80 | unit & 0x3F))
    if len(out) > _UTF_MAX:
        raise ValueError(f"string of {len(out)} bytes is too long for an NDList field (max {_UTF_MAX})")
    return _USHORT.pack(len(out)) + bytes(out)


def _from_java_utf(raw: bytes) -> str:
    """Inverse of :func:`_java_utf` (plain UTF-8 is accepted too)."""
    try:
        text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
        return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be")
    except UnicodeError as exc:
        raise ValueError(f"NDList string is not valid (modified) UTF-8: {exc}") from exc


# ------------------------------------------------------------------------------------ encode


def _string_items(array: Any) -> list[str] | None:
    """The array's strings in C order when it holds text (``<U`` or all-``str`` objects), else ``None``."""
    if array.dtype.kind == "U":
        return [str(s) for s in array.reshape(-1).tolist()]
    if array.dtype.kind == "O":
        items = array.reshape(-1).tolist()
        if all(isinstance(s, str) for s in items):
            return items
    return None


def _encode_array(numpy: ModuleType, value: Any, out: bytearray) -> None:
    array = numpy.asarray(value)
    strings = _string_items(array)
    if strings is not None:
        type_name = "STRING"
    else:
        type_name = _NUMPY_TO_DJL.get(array.dtype.name, "")
        if not type_name:
            raise ValueError(f"numpy dtype {array.dtype} has no DJL NDList data type")
    out += _java_utf(MAGIC_NUMBER) + _INT.pack(VERSION) + b"\x00"  # no name
    out += _java_utf("default") + _java_utf(type_name)
    out += _INT.pack(array.ndim) + b"".join(_LONG.pack(d) for d in array.shape)
    out += _INT.pack(array.ndim) + _USHORT.pack(ord("?")) * array.ndim
    if strings is not None:
        out += _INT.pack(len(strings)) + b"".join(_java_utf(s) for s in strings)
        return
    data = numpy.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    out += b"<" + _INT.pack(len(data)) + data


def to_nd_list(np_list: Any) -> bytearray:
    """Encode arrays as a DJL NDList (``tensor/ndlist``), little-endian, without names.

    ``np_list`` is a list or tuple of arrays (anything ``numpy.asarray`` takes); any other value is
    one array. Numeric dtypes, ``bool`` and text arrays (``STRING``) are supported; ``ValueError``
    names any other dtype.
    """
    numpy = _numpy()
    items = list(np_list) if isinstance(np_list, list | tuple) else [np_list]
    out = bytearray(_INT.pack(len(items)))
    for value in items:
        _encode_array(numpy, value, out)
    return out


# ------------------------------------------------------------------------------------ decode


class _Reader:
    """Bounds-checked big-endian reads over a byte buffer."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(f"NDList is truncated: {what} needs {n} bytes at offset {self.pos}")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int32(self, what: str) -> int:
        value: int = _INT.unpack(self.take(4, what))[0]
        return value

    def int64(self, what: str) -> int:
        value: int = _LONG.unpack(self.take(8, what))[0]
        return value

    def byte(self, what: str) -> int:
        return self.take(1, what)[0]

    def utf(self, what: str) -> str:
        (length,) = _USHORT.unpack(self.take(2, what))
        return _from_java_utf(self.take(length, what))


def _decode_array(numpy: ModuleType, reader: _Reader) -> Any:
    magic = reader.utf("magic")
    if magic != MAGIC_NUMBER:
        raise ValueError(f"NDList array does not start with {MAGIC_NUMBER!r} (got {magic!r})")
    version = reader.int32("version")
    if not 1 <= version <= VERSION:
        raise ValueError(f"NDList array version {version} is not supported (1..{VERSION})")
    if version > 1 and reader.byte("name flag") == 1:
        reader.utf("name")
    reader.utf("sparse format")
    type_name = reader.utf("data type")
    ndim = reader.int32("shape")
    if not 0 <= ndim <= _MAX_DIMS:
        raise ValueError(f"NDList array has {ndim} dimensions (0..{_MAX_DIMS} allowed)")
    shape = tuple(reader.int64("shape") for _ in range(ndim))
    if any(d < 0 for d in shape):
        raise ValueError(f"NDList array shape {shape} has a negative dimension")
    layout = reader.int32("layout")
    if not 0 <= layout <= _MAX_DIMS:
        raise ValueError(f"NDList array has a layout of {layout} characters (0..{_MAX_DIMS} allowed)")
    reader.take(2 * layout, "layout")
    count = math.prod(shape)
    if type_name == "STRING":
        size = reader.int32("string count")
        if size != count:
            raise ValueError(f"NDList STRING array has {size} strings for shape {shape}")
        strings = [reader.utf("string") for _ in range(size)]
        return numpy.array(strings, dtype=str).reshape(shape)
    name = _DJL_TO_NUMPY.get(type_name.upper())
    if name is None:
        raise ValueError(f"NDList data type {type_name!r} is not supported with numpy")
    order = "<" if version < 3 else (">" if reader.byte("byte order") == ord(">") else "<")
    length = reader.int32("data length")
    dtype = numpy.dtype(name)
    if length != count * dtype.itemsize:
        raise ValueError(f"NDList {type_name} array of shape {shape} has {length} data bytes")
    raw = reader.take(length, "data")
    array = numpy.frombuffer(raw, dtype=dtype.newbyteorder(order)).reshape(shape)
    return array.astype(dtype)  # a writable copy in native byte order


def _decode_safetensors(numpy: ModuleType, data: bytes) -> list[Any]:
    reader = _Reader(data)
    (size,) = struct.unpack("<Q", reader.take(8, "safetensors header length"))
    try:
        header = json.loads(reader.take(size, "safetensors header"))
    except (UnicodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"safetensors header is not JSON: {exc}") from exc
    body = data[8 + size :]
    entries = sorted(
        (v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)),
        key=lambda v: list(v.get("data_offsets") or [0]),
    )
    result = []
    for entry in entries:
        name = _SAFETENSORS_TO_NUMPY.get(str(entry.get("dtype")))
        if name is None:
            raise ValueError(f"safetensors dtype {entry.get('dtype')!r} is not supported with numpy")
        start, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if not 0 <= start <= end <= len(body):
            raise ValueError(f"safetensors data_offsets {[start, end]} outside the data")
        array = numpy.frombuffer(body[start:end], dtype=numpy.dtype(name).newbyteorder("<"))
        result.append(array.reshape(shape).astype(name))
    return result


def _decode_numpy_formats(numpy: ModuleType, data: bytes) -> list[Any]:
    if data[:2] == b"PK":
        with numpy.load(io.BytesIO(data), allow_pickle=False) as archive:
            return [archive[name] for name in archive.files]
    if data[:6] == b"\x93NUMPY":
        return [numpy.load(io.BytesIO(data), allow_pickle=False)]
    return _decode_safetensors(numpy, data)


def from_nd_list(encoded: bytes | bytearray | memoryview) -> list[Any]:
    """Decode a ``tensor/ndlist`` payload into a list of numpy arrays (native byte order, writable).

    Reads DJL's NDList format and, like Java's ``NDList.decode``, ``.npz``, ``.npy`` and safetensors
    bytes. ``ValueError`` for a malformed or truncated payload.
    """
    numpy = _numpy()
    data = bytes(encoded)
    if data[:2] == b"PK" or data[:6] == b"\x93NUMPY" or (len(data) > 8 and data[8:9] == b"{"):
        try:
            return _decode_numpy_formats(numpy, data)
        except ValueError:
            raise
        except Exception as exc:  # zipfile, numpy and json errors of a malformed payload
            raise ValueError(f"malformed npz/npy/safetensors payload: {exc!r}") from exc
    reader = _Reader(data)
    size = reader.int32("list size")
    if size < 0 or size > len(data):
        raise ValueError(f"NDList size {size} is invalid")
    return [_decode_array(numpy, reader) for _ in range(size)]
