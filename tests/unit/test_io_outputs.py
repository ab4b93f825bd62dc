"""``Output``: djl_python's builder API, JSON encoding, errors, and ``send`` through the wire codec."""

from __future__ import annotations

import datetime
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from djl_handlers.io import Output, wire
from djl_handlers.testing.sockets import sent_bytes

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "wire"


def load_hex(name: str) -> bytes:
    """Bytes of a golden ``.hex`` file (``#`` comments, whitespace-separated hex pairs)."""
    text = (GOLDEN / name).read_text(encoding="utf-8")
    return bytes.fromhex("".join(line.split("#", 1)[0] for line in text.splitlines()))




# ---------------------------------------------------------------------------------- builder


def test_defaults_and_chaining() -> None:
    out = Output()
    assert (out.code, out.message, out.properties, out.content.size()) == (200, "OK", {}, 0)
    same = out.set_code(201).set_message("Created").add_property("X-A", "1")
    assert same is out and (out.code, out.message) == (201, "Created")
    assert out.get_properties() == {"X-A": "1"}
    assert out.get_property("X-A") == "1" and out.get_property("x-a") is None


def test_add_value_types_and_keys() -> None:
    out = Output().add("é").add(b"b", key="raw").add(bytearray(b"c"), key=5).add({"x": 1}, key="j")
    out.add("t", key="data", batch_index=3).add("u", batch_index=0)
    assert out.content.get_keys() == [None, "raw", "5", "j", "batch_3.data", "batch_0."]
    assert out.content.get_values() == [
        "é".encode(),
        bytearray(b"b"),
        bytearray(b"c"),
        bytearray(b'{\n  "x":1\n}'),
        b"t",
        b"u",
    ]
    assert [type(v) for v in out.content.get_values()] == [
        bytes,
        bytearray,
        bytearray,
        bytearray,
        bytes,
        bytes,
    ]


def test_add_as_json_is_djl_pretty_print() -> None:
    out = Output().add_as_json({"generated_text": "héllo", "list": [1, 2]}, key="k", batch_index=1)
    body = bytes(out.content.value_at(0))
    assert body == '{\n  "generated_text":"héllo",\n  "list":[\n    1,\n    2\n  ]\n}'.encode()
    assert out.content.key_at(0) == "batch_1.k"
    with pytest.raises(ValueError):
        Output().add_as_json({"x": float("nan")})


def test_json_encoder_handles_datetime_and_numpy() -> None:
    numpy = pytest.importorskip("numpy")
    value = {
        "t": datetime.datetime(2024, 1, 2, 3, 4, 5),
        "i": numpy.int64(3),
        "f": numpy.float32(0.5),
        "a": numpy.arange(2),
    }
    body = json.loads(bytes(Output().add_as_json(value).content.value_at(0)))
    assert body == {"t": "2024-01-02 03:04:05", "i": 3, "f": 0.5, "a": [0, 1]}
    with pytest.raises(TypeError):
        Output().add_as_json({"s": {1, 2}})


def test_error_body_and_status() -> None:
    out = Output().error("boom")
    assert (out.code, out.message) == (424, "prediction failure")
    assert out.get_property("content-type") == "application/json"
    assert (
        bytes(out.content.value_at(0))
        == b'{\n  "code":424,\n  "message":"prediction failure",\n  "error":"boom"\n}'
    )
    custom = Output().error("bad", code=400, message="invalid")
    assert json.loads(bytes(custom.content.value_at(0))) == {
        "code": 400,
        "message": "invalid",
        "error": "bad",
    }


def test_binary_encode_and_write_utf8() -> None:
    record = Output.binary_encode({"data": "He", "last": False})
    assert type(record) is bytearray and bytes(record) == load_hex("a4_record.hex")
    buf = bytearray(b"\x01")
    Output.write_utf8(buf, "é")
    Output.write_utf8(buf, None)
    assert bytes(buf) == b"\x01\x00\x00\x00\x02\xc3\xa9\xff\xff\xff\xff"


def test_finalize() -> None:
    assert Output().execute_finalize() is None
    out = Output().finalize(lambda a, b, c: a + b + c, 1, 2, 3)
    assert out.execute_finalize() == 6


def test_str_shows_types_not_values() -> None:
    text = str(Output().add_property("a", "b").add(b"x", key="data"))
    assert json.loads(text) == {
        "code": 200,
        "message": "OK",
        "properties": {"a": "b"},
        "content": {"data": "type: <class 'bytearray'>"},
    }
    assert text.startswith('{\n  "code": 200')


# ------------------------------------------------------------------------------------- send


def test_send_non_streaming_matches_golden() -> None:
    out = Output().add_property("content-type", "application/json").add_as_json({"generated_text": "hi"})
    assert sent_bytes(out) == load_hex("a2_response_frame.hex")


def test_send_rolling_batch_frame_matches_golden() -> None:
    out = Output()
    out.add_property("batch_0_Content-Type", "application/jsonlines")
    out.add_property("batch_1_Content-Type", "application/json")
    out.add(Output.binary_encode({"data": "He", "last": False}), key="data", batch_index=0)
    out.add(Output.binary_encode({"data": "Hi", "last": True}), key="data", batch_index=1)
    assert sent_bytes(out) == load_hex("a5_rolling_batch_frame.hex")


def test_send_coerces_property_values_with_str() -> None:
    frame = wire.read_output_frame(
        io.BytesIO(sent_bytes(Output().add_property("n", 3).add_property("b", True)))
    )
    assert frame.properties == {"n": "3", "b": "True"}


def test_send_streaming_unformatted_matches_golden() -> None:
    out = Output().add_property("content-type", "application/jsonlines")
    out.add_stream_content(iter(["He", b"llo"]), output_formatter=None)
    assert sent_bytes(out) == load_hex("a3_stream_frame.hex")


def test_send_streaming_error_tail_matches_golden() -> None:
    def tokens() -> Iterator[str]:
        yield "He"
        raise RuntimeError("boom")

    out = Output().add_stream_content(tokens(), output_formatter=None)
    assert sent_bytes(out) == load_hex("a3_stream_error_frame.hex")


def test_send_streaming_default_formatter_and_json_items() -> None:
    out = Output().add_stream_content(iter(["a", ["é", 1]]))
    frame = wire.read_output_frame(io.BytesIO(sent_bytes(out)))
    assert frame.chunks is not None
    assert list(frame.chunks) == [
        (b'{"outputs": "a"}\n', True),
        (b'{"outputs": ["\\u00e9", 1]}\n', True),
        (b"", False),
    ]
    raw = Output().add_stream_content(iter([{"k": 1}, bytearray(b"z")]), output_formatter=None)
    chunks = wire.read_output_frame(io.BytesIO(sent_bytes(raw))).chunks
    assert chunks is not None and list(chunks) == [(b'{\n  "k":1\n}', True), (b"z", True), (b"", False)]


def test_send_streaming_formatter_failure_becomes_tail() -> None:
    def formatter(item: object) -> str:
        raise ValueError(f"cannot format {item}")

    out = Output().add_stream_content(iter(["x"]), output_formatter=formatter)
    chunks = wire.read_output_frame(io.BytesIO(sent_bytes(out))).chunks
    assert chunks is not None and list(chunks) == [(b"cannot format x", False)]


def test_send_to_binary_stream() -> None:
    stream = io.BytesIO()
    Output().add("x").send(stream)
    frame = wire.read_output_frame(io.BytesIO(stream.getvalue()))
    assert frame.content == [(None, b"x")]
