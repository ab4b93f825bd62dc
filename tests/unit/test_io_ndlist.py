"""DJL's ``tensor/ndlist`` codec (``djl_handlers.io.ndlist``) against bytes written from the format spec.

The expected bytes are spelled out by hand from DJL's Java ``NDList.encode`` / ``NDSerializer``
(see the module docstring), not produced by the code under test.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import zipfile
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from djl_handlers.io import Input, Output
from djl_handlers.io.ndlist import from_nd_list, to_nd_list

np = pytest.importorskip("numpy")

# np.arange(6, dtype=float32).reshape(2, 3), as DJL writes it (djl_python's sparse name "default").
GOLDEN_F32 = bytes.fromhex(
    "00000001"  # 1 array
    "0004" "4e444152"  # utf "NDAR"
    "00000003"  # version 3
    "00"  # no name
    "0007" "64656661756c74"  # utf "default" (sparse format)
    "0007" "464c4f41543332"  # utf "FLOAT32"
    "00000002" "0000000000000002" "0000000000000003"  # shape (2, 3)
    "00000002" "003f" "003f"  # layout "??"
    "3c"  # '<' little-endian
    "00000018"  # 24 data bytes
    "00000000" "0000803f" "00000040" "00004040" "00008040" "0000a040"
)  # fmt: skip


def _utf(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack(">H", len(raw)) + raw


def _record(
    dtype: str, shape: tuple[int, ...], data: bytes, *, version: int = 3, name: str | None = None, order: bytes = b"<"
) -> bytes:
    """One array record, built field by field from the spec (Java writes "DENSE" for the sparse format)."""
    out = _utf("NDAR") + struct.pack(">i", version)
    if version > 1:
        out += b"\x00" if name is None else b"\x01" + _utf(name)
    out += _utf("DENSE") + _utf(dtype)
    out += struct.pack(">i", len(shape)) + b"".join(struct.pack(">q", d) for d in shape)
    out += struct.pack(">i", len(shape)) + b"\x00?" * len(shape)
    if version > 2:
        out += order
    return out + struct.pack(">i", len(data)) + data


def _same(a: Any, b: Any) -> bool:
    return bool(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes())


# ----------------------------------------------------------------------------------- encode


def test_encode_matches_spec_bytes() -> None:
    assert bytes(to_nd_list([np.arange(6, dtype=np.float32).reshape(2, 3)])) == GOLDEN_F32


def test_single_array_and_tuple_are_accepted() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert bytes(to_nd_list(arr)) == GOLDEN_F32
    assert bytes(to_nd_list((arr,))) == GOLDEN_F32
    assert bytes(to_nd_list([])) == b"\x00\x00\x00\x00"


def test_big_endian_and_strided_inputs_are_written_little_endian_c_order() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(3, 2).T  # (2, 3), not C-contiguous
    big = np.arange(6, dtype=">f4").reshape(2, 3)
    assert bytes(to_nd_list([big])) == GOLDEN_F32
    decoded = from_nd_list(to_nd_list([arr]))[0]
    assert decoded.tolist() == arr.tolist()


def test_bool_is_written_as_java_boolean_and_djl_python_bool_is_read() -> None:
    encoded = bytes(to_nd_list([np.array([True, False])]))
    assert _utf("BOOLEAN") in encoded
    djl_python_style = _record("BOOL", (2,), b"\x01\x00")
    assert from_nd_list(struct.pack(">i", 1) + djl_python_style)[0].tolist() == [True, False]


def test_unsupported_dtypes_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="complex128"):
        to_nd_list([np.array([1j])])
    with pytest.raises(ValueError, match="object"):
        to_nd_list([np.array([{"a": 1}], dtype=object)])


def test_strings_use_java_modified_utf8() -> None:
    arr = np.array([["a", "é"], ["x\x00y", "\U0001d11e"]])  # numpy drops a trailing NUL
    encoded = bytes(to_nd_list([arr]))
    assert _utf("STRING") in encoded
    assert b"\x00\x04x\xc0\x80y" in encoded  # NUL is C0 80
    assert b"\x00\x06\xed\xa0\xb4\xed\xb4\x9e" in encoded  # U+1D11E as two 3-byte surrogates
    back = from_nd_list(encoded)[0]
    assert back.shape == (2, 2) and back.tolist() == arr.tolist()
    objects = np.array(["x", "yz"], dtype=object)
    assert from_nd_list(to_nd_list([objects]))[0].tolist() == ["x", "yz"]


# ----------------------------------------------------------------------------------- decode


def test_decode_spec_bytes() -> None:
    (arr,) = from_nd_list(bytearray(GOLDEN_F32))
    assert arr.dtype == np.float32 and arr.shape == (2, 3) and arr.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert arr.flags.writeable and arr.dtype.isnative
    arr[0, 0] = 9  # a copy, not a view of the payload


def test_decode_java_style_records() -> None:
    """Big-endian data, a name, Java's "DENSE", versions 1 and 2, several arrays in one list."""
    big = _record("INT32", (2,), struct.pack(">ii", 7, -8), name="logits", order=b">")
    v2 = _record("FLOAT64", (), struct.pack("<d", 1.5), version=2)
    v1 = _record("UINT8", (3,), b"\x01\x02\xff", version=1)
    empty = _record("INT64", (0, 4), b"")
    result = from_nd_list(struct.pack(">i", 4) + big + v2 + v1 + empty)
    assert [a.tolist() for a in result] == [[7, -8], 1.5, [1, 2, 255], []]
    assert [str(a.dtype) for a in result] == ["int32", "float64", "uint8", "int64"]
    assert result[0].dtype.isnative and result[3].shape == (0, 4)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\x00\x00\x00\x01" + _utf("NDAX"), "NDAR"),
        (b"\x00\x00\x00\x01" + _utf("NDAR") + struct.pack(">i", 4), "version 4"),
        (b"\x00\x00\x00\x01" + _record("BFLOAT16", (1,), b"\x00\x00"), "BFLOAT16"),
        (b"\x00\x00\x00\x01" + _record("FLOAT32", (2,), b"\x00" * 4), "4 data bytes"),
        (b"\x00\x00\x00\x01" + _record("FLOAT32", (-1,), b""), "negative"),
        (GOLDEN_F32[:-3], "truncated"),
        (b"\x00\x00\x00\x02" + GOLDEN_F32[4:], "truncated"),
        (b"\xff\xff\xff\xff", "size -1"),
        (b"\x00\x00", "truncated"),
        (b"PK\x03\x04garbage", "npz"),
    ],
)
def test_malformed_payloads_raise_value_error(payload: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_nd_list(payload)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_value_error(data: bytes) -> None:
    try:
        from_nd_list(data)
    except ValueError:
        pass


_DTYPES = [
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"
]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(_DTYPES),
    shape=st.lists(st.integers(0, 4), max_size=4).map(tuple),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip_every_dtype(dtype: str, shape: tuple[int, ...], seed: int) -> None:
    raw = np.random.default_rng(seed).bytes(int(np.prod(shape)) * np.dtype(dtype).itemsize)
    arr = np.frombuffer(raw, dtype=np.uint8).astype(bool) if dtype == "bool" else np.frombuffer(raw, dtype=dtype)
    arr = arr.reshape(shape)
    (back,) = from_nd_list(to_nd_list([arr]))
    assert _same(back, arr)


# ------------------------------------------------------------------- other formats Java reads


def test_decode_npz_npy_and_safetensors() -> None:
    a, b = np.arange(4, dtype=np.int16), np.ones((2, 2))
    npz = io.BytesIO()
    np.savez(npz, a, b)
    assert all(_same(x, y) for x, y in zip(from_nd_list(npz.getvalue()), [a, b], strict=True))
    npy = io.BytesIO()
    np.save(npy, b)
    assert _same(from_nd_list(npy.getvalue())[0], b)
    header = {
        "__metadata__": {"format": "pt"},
        "second": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
        "first": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]},
    }
    head = json.dumps(header).encode()
    blob = struct.pack("<Q", len(head)) + head + struct.pack("<q", -3) + struct.pack("<ff", 0.5, 2.0)
    first, second = from_nd_list(blob)
    assert first.tolist() == [-3] and second.tolist() == [0.5, 2.0]


def test_pickled_npz_is_refused() -> None:
    buffer = io.BytesIO()
    np.savez(buffer, np.array([{"x": 1}], dtype=object))
    with pytest.raises(ValueError, match="pickle"):
        from_nd_list(buffer.getvalue())
    assert zipfile.is_zipfile(io.BytesIO(buffer.getvalue()))


# ------------------------------------------------------------------------- Input / Output API


def test_output_add_as_numpy_and_input_get_as_numpy() -> None:
    nd = [np.ones((1, 3, 2)), np.arange(3, dtype=np.int64)]
    out = Output().add_as_numpy(nd, key="x").add_as_numpy(nd[1], batch_index=2)
    assert out.content.get_keys() == ["x", "batch_2."]
    assert bytes(out.content.value_at(0)) == bytes(to_nd_list(nd))
    request = Input.from_parts({"Content-Type": "tensor/ndlist"}, [("x", out.content.value_at(0))])
    got = request.get_as_numpy("x")
    assert all(_same(g, n) for g, n in zip(got, nd, strict=True))
    assert all(_same(g, n) for g, n in zip(request.get_data("x"), nd, strict=True))
    assert str(request) == "properties: {'Content-Type': 'tensor/ndlist'}\nx: " + str(nd)


def test_private_helpers_of_djl_python_output() -> None:
    assert Output._encode_json({"a": "é"}) == bytearray('{\n  "a":"é"\n}'.encode())
    assert Output._default_stream_output_formatter("tok") == bytearray(b'{"outputs": "tok"}\n')
    assert Output().add_stream_content(iter(())).stream_output_formatter is Output._default_stream_output_formatter
    assert Output().add_as_string("a,b\r\n1,2", key="csv").content.get("csv") == b"a,b\r\n1,2"


def test_numpy_is_imported_only_when_a_tensor_method_runs() -> None:
    code = (
        "import sys\n"
        "from djl_handlers.io import Input, Output, encode_decode, ndlist\n"
        "out = Output().add_as_json({'a': 1}).add_as_string('x')\n"
        "inp = Input.from_parts({'content-type': 'application/json'}, [('data', b'{}')])\n"
        "assert encode_decode.decode(inp, 'application/json') == {}\n"
        "assert 'numpy' not in sys.modules, 'numpy imported too early'\n"
        "Output().add_as_numpy([[1, 2]])\n"
        "assert 'numpy' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
