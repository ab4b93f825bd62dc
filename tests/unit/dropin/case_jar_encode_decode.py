"""DJL's own ``encode_decode.py`` from the jar (v0.27-0.34 code) working on our Input/Output."""

from __future__ import annotations

import numpy as np
from djl_python import Input, Output
from djl_python.encode_decode_jar import decode, encode


def _request(content_type: str, body: bytes) -> Input:
    request = Input()
    request.properties["Content-Type"] = content_type
    request.content.add(key="data", value=bytearray(body))
    return request


def test_encode_default_branch_writes_an_ndlist() -> None:
    nd = [np.arange(6, dtype=np.float32).reshape(2, 3)]
    out = Output()
    encode(out, nd, "custom/type")
    assert out.get_property("Content-Type") == "tensor/ndlist"
    back = decode(_request("tensor/ndlist", bytes(out.content.value_at(0))), "tensor/ndlist")
    assert np.array_equal(back["inputs"][0], nd[0]) and back["inputs"][0].dtype == np.float32


def test_encode_json_npz_and_csv() -> None:
    out = Output()
    encode(out, {"r": "é"}, "application/json", key="j")
    encode(out, [np.ones(2)], "tensor/npz", key="n")
    encode(out, [{"name": "Axl"}], "text/csv", key="c")
    assert out.content.get("j") == bytearray('{\n  "r":"é"\n}'.encode())
    assert decode(_request("tensor/npz", bytes(out.content.get("n"))), "tensor/npz")["inputs"][0].tolist() == [1, 1]
    assert bytes(out.content.get("c")) == b"name\r\nAxl\r\n"


def test_decode_branches() -> None:
    assert decode(_request("application/json", b'{"inputs": "x"}'), "application/json") == {"inputs": "x"}
    assert decode(_request("text/plain", b"hi"), "text/plain") == {"inputs": ["hi"]}
    assert decode(_request("", b""), "") == {"inputs": ""}
    assert decode(_request("application/octet-stream", b"\x00"), "application/octet-stream") == {"inputs": b"\x00"}
