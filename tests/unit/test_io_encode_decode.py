"""``djl_handlers.io.encode_decode``: DJL's content-type dispatch, on our real Input/Output.

Covers what DJL's own ``test_encode_decode.py`` (v0.35+, not shipped in the 0.34 jar) checks: the
call each content type makes (through ``Mock(spec=...)`` of our classes, so a missing method fails)
and, beyond it, the real bytes through our ``Input``/``Output``.
"""

from __future__ import annotations

import csv
import io
from typing import Any
from unittest import mock

import pytest

from djl_handlers.io import Input, Output, encode_decode
from djl_handlers.io.encode_decode import decode, decode_csv, encode, encode_csv
from djl_handlers.io.ndlist import to_nd_list

np = pytest.importorskip("numpy")


def _input(body: bytes, content_type: str | None = None, key: str = "data") -> Input:
    props = {} if content_type is None else {"Content-Type": content_type}
    return Input.from_parts(props, [(key, body)])


# ---------------------------------------------------------------------------------- CSV


def test_decode_csv_with_inputs_column() -> None:
    assert decode_csv(_input(b"inputs,other\nfirst,1\nsecond,2")) == {"inputs": ["first", "second"]}


def test_decode_csv_question_context_rows() -> None:
    body = b"question,context\nWhat is AI?,tech\nWhat is ML?,learning"
    assert decode_csv(_input(body)) == {
        "inputs": [{"question": "What is AI?", "context": "tech"}, {"question": "What is ML?", "context": "learning"}]
    }


@pytest.mark.parametrize("body", [b"invalid,header\nv1,v2", b""])
def test_decode_csv_without_known_header_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError, match="correct CSV with Header columns"):
        decode_csv(_input(body))


def test_decode_csv_numeric_without_headers() -> None:
    result = decode(_input(b"1,2,3\n4,5,6"), "text/csv", require_csv_headers=False)
    assert result.tolist() == [[1, 2, 3], [4, 5, 6]]
    with pytest.raises(ValueError, match="non-numeric"):
        decode_csv(_input(b"1,x\n3,4"), require_headers=False)


def test_encode_csv_rows() -> None:
    text = encode_csv([{"name": "Axl", "age": "30"}, {"name": "Fiona", "age": "25"}])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["name"] for r in rows] == ["Axl", "Fiona"] and rows[1]["age"] == "25"
    assert encode_csv(iter([{"a": 1}])) == "a\r\n1\r\n"


# ------------------------------------------------------------------------- decode dispatch


@pytest.mark.parametrize(
    ("content_type", "method", "expected"),
    [
        ("application/json", "get_as_json", "VALUE"),
        ("text/plain", "get_as_string", {"inputs": ["VALUE"]}),
        ("image/jpeg", "get_as_image", {"inputs": "VALUE"}),
        ("audio/wav", "get_as_bytes", {"inputs": "VALUE"}),
        ("tensor/npz", "get_as_npz", {"inputs": "VALUE"}),
        ("tensor/ndlist", "get_as_numpy", {"inputs": "VALUE"}),
        ("application/x-npy", "get_as_numpy", {"inputs": "VALUE"}),
        ("application/x-www-form-urlencoded", "get_as_string", {"inputs": "VALUE"}),
        ("application/octet-stream", "get_as_bytes", {"inputs": "VALUE"}),
    ],
)
def test_decode_calls_the_input_method_for_its_content_type(content_type: str, method: str, expected: Any) -> None:
    inputs = mock.Mock(spec=Input)
    getattr(inputs, method).return_value = "VALUE"
    assert decode(inputs, content_type, key="k") == expected
    getattr(inputs, method).assert_called_once_with(key="k")


def test_decode_without_content_type() -> None:
    inputs = mock.Mock(spec=Input)
    inputs.get_as_bytes.return_value = None
    assert decode(inputs, None) == {"inputs": ""}
    inputs.get_as_bytes.return_value = b'{"t": 1}'
    inputs.get_as_json.return_value = {"t": 1}
    assert decode(inputs, "") == {"t": 1}


def test_decode_csv_is_looked_up_at_call_time() -> None:
    inputs = mock.Mock(spec=Input)
    with mock.patch.object(encode_decode, "decode_csv", return_value={"inputs": ["x"]}) as patched:
        assert decode(inputs, "text/csv") == {"inputs": ["x"]}
    patched.assert_called_once_with(inputs, require_headers=True)


def test_decode_real_inputs() -> None:
    nd = [np.arange(3, dtype=np.int32)]
    assert decode(_input(b'{"inputs": "hi"}'), None) == {"inputs": "hi"}
    assert decode(_input(b""), None) == {"inputs": ""}
    assert decode(_input("héllo".encode()), "text/plain") == {"inputs": ["héllo"]}
    assert decode(_input(bytes(to_nd_list(nd))), "tensor/ndlist")["inputs"][0].tolist() == [0, 1, 2]
    npy = io.BytesIO()
    np.save(npy, nd[0])
    assert decode(_input(npy.getvalue()), "application/x-npy")["inputs"][0].tolist() == [0, 1, 2]
    assert decode(_input(b"a=1&b=2"), "application/x-www-form-urlencoded") == {"inputs": "a=1&b=2"}
    assert decode(_input(b"\x00\x01"), "application/octet-stream") == {"inputs": b"\x00\x01"}


# ------------------------------------------------------------------------- encode dispatch


@pytest.mark.parametrize(
    ("content_type", "method", "header"),
    [
        (None, "add_as_json", "application/json"),
        ("application/json", "add_as_json", "application/json"),
        ("tensor/npz", "add_as_npz", "tensor/npz"),
        ("custom/type", "add_as_numpy", "tensor/ndlist"),
    ],
)
def test_encode_calls_the_output_method_for_its_content_type(
    content_type: str | None, method: str, header: str
) -> None:
    outputs = mock.Mock(spec=Output)
    encode(outputs, "PRED", content_type, key="k")
    getattr(outputs, method).assert_called_once_with("PRED", key="k")
    outputs.add_property.assert_called_once_with("Content-Type", header)


def test_encode_csv_goes_through_add_as_string() -> None:
    outputs = mock.Mock(spec=Output)
    with mock.patch.object(encode_decode, "encode_csv", return_value="a\r\n1\r\n") as patched:
        encode(outputs, [{"a": 1}], "text/csv")
    patched.assert_called_once_with([{"a": 1}])
    outputs.add_as_string.assert_called_once_with("a\r\n1\r\n", key=None)
    outputs.add_property.assert_called_once_with("Content-Type", "text/csv")


def test_encode_real_outputs_and_read_them_back() -> None:
    nd = [np.ones((2, 2), dtype=np.float32)]
    cases = [
        (None, {"r": "ok"}, "application/json"),
        ("text/csv", [{"name": "Axl"}], "text/csv"),
        ("tensor/npz", nd, "tensor/npz"),
        ("custom/type", nd, "tensor/ndlist"),
    ]
    for content_type, prediction, header in cases:
        out = Output()
        encode(out, prediction, content_type, key="data")
        assert out.get_property("Content-Type") == header
        back = Input.from_parts({"content-type": header}, [("data", out.content.get("data"))])
        if header == "application/json":
            assert back.get_as_json() == prediction
        elif header == "text/csv":
            assert back.get_as_csv() == prediction
        else:
            assert back.get_data("data")[0].tolist() == nd[0].tolist()
