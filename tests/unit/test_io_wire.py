"""Wire codec: byte-exact goldens from the reference's Appendix A, round trips and error paths."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from djl_handlers.io import wire

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "wire"


def load_hex(name: str) -> bytes:
    """Bytes of a golden ``.hex`` file: whitespace-separated hex pairs, ``#`` starts a comment."""
    text = (GOLDEN / name).read_text(encoding="utf-8")
    digits = "".join(line.split("#", 1)[0] for line in text.splitlines())
    return bytes.fromhex(digits)


RECORD_HE = {"data": "He", "last": False}
RECORD_HI = {"data": "Hi", "last": True}


# ------------------------------------------------------------------------------------ goldens


def test_a1_request_frame_bytes_and_back() -> None:
    golden = load_hex("a1_request_frame.hex")
    frame = wire.encode_input_frame({"handler": "handle"}, [("data", b'{"inputs":"hi"}')])
    assert frame == golden
    assert wire.read_input_frame(io.BytesIO(golden)) == (
        {"handler": "handle"},
        [("data", b'{"inputs":"hi"}')],
    )


def test_a1_null_key_and_empty_value() -> None:
    golden = load_hex("a1_request_null_key.hex")
    content = [(None, b""), ("seed", b"42")]
    assert wire.encode_input_frame({}, content) == golden
    assert wire.read_input_frame(io.BytesIO(golden)) == ({}, content)


def test_a2_response_frame_bytes_and_back() -> None:
    golden = load_hex("a2_response_frame.hex")
    body = b'{\n  "generated_text":"hi"\n}'
    props = {"content-type": "application/json"}
    assert wire.encode_output_frame(200, "OK", props, [(None, body)]) == golden
    frame = wire.read_output_frame(io.BytesIO(golden))
    assert (frame.code, frame.message, frame.properties) == (200, "OK", props)
    assert frame.content == [(None, body)]
    assert frame.chunks is None


def test_a3_stream_frame_bytes_and_back() -> None:
    golden = load_hex("a3_stream_frame.hex")
    props = {"content-type": "application/jsonlines"}
    encoded = (
        wire.encode_stream_header(200, "OK", props)
        + wire.encode_stream_chunk(b"He", True)
        + wire.encode_stream_chunk(b"llo", True)
        + wire.encode_stream_chunk(b"", False)
    )
    assert encoded == golden
    frame = wire.read_output_frame(io.BytesIO(golden))
    assert frame.content is None and frame.chunks is not None
    assert frame.properties == props
    assert list(frame.chunks) == [(b"He", True), (b"llo", True), (b"", False)]


def test_a3_stream_error_tail() -> None:
    golden = load_hex("a3_stream_error_frame.hex")
    frame = wire.read_output_frame(io.BytesIO(golden))
    assert frame.chunks is not None
    assert list(frame.chunks) == [(b"He", True), (b"boom", False)]


def test_stream_chunks_are_read_lazily() -> None:
    golden = load_hex("a3_stream_frame.hex")
    stream = io.BytesIO(golden)
    frame = wire.read_output_frame(stream)
    header_end = stream.tell()
    assert header_end < len(golden)
    assert frame.chunks is not None
    assert next(frame.chunks) == (b"He", True)
    assert stream.tell() == header_end + 7


def test_a4_records() -> None:
    assert wire.binary_encode(RECORD_HE) == load_hex("a4_record.hex")
    error = {"data": "", "last": True, "code": 424, "error": "bad"}
    assert wire.binary_encode(error) == load_hex("a4_error_record.hex")
    assert wire.binary_decode(load_hex("a4_error_record.hex")) == {
        "data": "",
        "last": "True",
        "code": "424",
        "error": "bad",
    }


def test_a5_rolling_batch_frame() -> None:
    golden = load_hex("a5_rolling_batch_frame.hex")
    props = {
        "batch_0_Content-Type": "application/jsonlines",
        "batch_1_Content-Type": "application/json",
    }
    content = [
        ("batch_0.data", wire.binary_encode(RECORD_HE)),
        ("batch_1.data", wire.binary_encode(RECORD_HI)),
    ]
    assert wire.encode_output_frame(200, "OK", props, content) == golden
    frame = wire.read_output_frame(io.BytesIO(golden))
    assert frame.content is not None
    assert [wire.binary_decode(v) for _, v in frame.content] == [
        {"data": "He", "last": "False"},
        {"data": "Hi", "last": "True"},
    ]


# ---------------------------------------------------------------------------- stream framing


def test_frames_back_to_back_then_clean_eof() -> None:
    first = wire.encode_input_frame({"a": "1"}, [("data", b"x")])
    second = wire.encode_input_frame({}, [])
    stream = io.BytesIO(first + second)
    assert wire.read_input_frame(stream) == ({"a": "1"}, [("data", b"x")])
    assert wire.read_input_frame(stream) == ({}, [])
    with pytest.raises(EOFError):
        wire.read_input_frame(stream)


class _Trickle(io.RawIOBase):
    """A stream that returns at most one byte per read, like a slow socket."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1, /) -> bytes:
        return self._data.read(min(n, 1) if n >= 0 else 1)


def test_short_reads_are_reassembled() -> None:
    golden = load_hex("a1_request_frame.hex")
    assert wire.read_input_frame(_Trickle(golden))[1] == [("data", b'{"inputs":"hi"}')]  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("cut", [1, 2, 5, 13, 30, 40])
def test_truncated_input_frame_is_value_error(cut: int) -> None:
    golden = load_hex("a1_request_frame.hex")
    with pytest.raises(ValueError, match="truncated"):
        wire.read_input_frame(io.BytesIO(golden[:cut]))


def test_empty_stream_is_eof() -> None:
    with pytest.raises(EOFError):
        wire.read_input_frame(io.BytesIO(b""))
    with pytest.raises(EOFError):
        wire.read_output_frame(io.BytesIO(b""))


def test_truncated_stream_chunk_is_value_error() -> None:
    golden = load_hex("a3_stream_frame.hex")
    frame = wire.read_output_frame(io.BytesIO(golden[:-8]))
    assert frame.chunks is not None
    assert next(frame.chunks) == (b"He", True)
    with pytest.raises(ValueError, match="truncated"):
        next(frame.chunks)


def test_bad_chunk_flag() -> None:
    data = wire.encode_stream_header(200, "OK", {}) + b"\x07" + struct.pack(">i", 0)
    frame = wire.read_output_frame(io.BytesIO(data))
    assert frame.chunks is not None
    with pytest.raises(ValueError, match="flag"):
        next(frame.chunks)


def _oversize_frame(length: int) -> bytes:
    return b"\x00\x00\x00\x01" + struct.pack(">i", 4) + b"data" + struct.pack(">i", length)


def test_oversize_length_rejected_before_reading() -> None:
    limit = 20 * 1024 * 1024
    assert wire.max_frame_bytes() == limit == wire.MAX_FRAME_BYTES
    with pytest.raises(ValueError, match="exceeds"):
        wire.read_input_frame(io.BytesIO(_oversize_frame(limit + 1)))


def test_env_overrides_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_NETTY_BUFFER_SIZE", "8")
    assert wire.max_frame_bytes() == 8
    ok = wire.encode_input_frame({}, [("data", b"12345678")])
    assert wire.read_input_frame(io.BytesIO(ok))[1] == [("data", b"12345678")]
    too_big = wire.encode_input_frame({}, [("data", b"123456789")])
    with pytest.raises(ValueError, match="exceeds the limit of 8"):
        wire.read_input_frame(io.BytesIO(too_big))
    monkeypatch.setenv("MAX_NETTY_BUFFER_SIZE", "not-a-number")
    assert wire.max_frame_bytes() == wire.MAX_FRAME_BYTES


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\xff\xff", "negative property count"),
        (b"\x00\x01\xff\xff\xff\xff", "null property key"),
        (b"\x00\x01\xff\xff\xff\xfe", "negative property key length"),
        (b"\x00\x01\x00\x00\x00\x02\xc3\x28", "UTF-8"),
        (b"\x00\x00\xff\xfe", "negative content count"),
    ],
)
def test_corrupt_input_frames(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        wire.read_input_frame(io.BytesIO(data))


def test_null_property_value_reads_as_empty_string() -> None:
    data = b"\x00\x01" + wire.encode_utf8("k") + wire.encode_utf8(None) + b"\x00\x00"
    assert wire.read_input_frame(io.BytesIO(data)) == ({"k": ""}, [])


def test_output_content_count_below_minus_one() -> None:
    data = wire.encode_stream_header(200, "OK", {})[:-2] + struct.pack(">h", -2)
    with pytest.raises(ValueError, match="content count"):
        wire.read_output_frame(io.BytesIO(data))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\x00\x01\x00\x00\x00\x01a",
        load_hex("a4_record.hex") + b"\x00",
        b"\x00\x01\xff\xff\xff\xff",
    ],
)
def test_binary_decode_rejects_corrupt_records(data: bytes) -> None:
    with pytest.raises(ValueError):
        wire.binary_decode(data)


def test_encoders_reject_values_that_do_not_fit_a_short() -> None:
    with pytest.raises(ValueError, match="status code"):
        wire.encode_output_frame(70000, "OK", {}, [])
    with pytest.raises(ValueError, match="property count"):
        wire.encode_input_frame({str(i): "" for i in range(40000)}, [])


def test_record_values_use_python_str() -> None:
    decoded = wire.binary_decode(wire.binary_encode({"a": True, "b": None, "c": 1.5, "d": "é"}))
    assert decoded == {"a": "True", "b": "None", "c": "1.5", "d": "é"}


# ------------------------------------------------------------------------ property tests

_text = st.text(max_size=20)
_props = st.dictionaries(_text, _text, max_size=6)
_content = st.lists(st.tuples(st.none() | _text, st.binary(max_size=64)), max_size=6)


@settings(max_examples=150, deadline=None)
@given(properties=_props, content=_content)
def test_input_frame_round_trip(properties: dict[str, str], content: list[tuple[str | None, bytes]]) -> None:
    stream = io.BytesIO(wire.encode_input_frame(properties, content) * 2)
    assert wire.read_input_frame(stream) == (properties, content)
    assert wire.read_input_frame(stream) == (properties, content)
    with pytest.raises(EOFError):
        wire.read_input_frame(stream)


@settings(max_examples=150, deadline=None)
@given(code=st.integers(-32768, 32767), message=_text, properties=_props, content=_content)
def test_output_frame_round_trip(
    code: int, message: str, properties: dict[str, str], content: list[tuple[str | None, bytes]]
) -> None:
    frame = wire.read_output_frame(io.BytesIO(wire.encode_output_frame(code, message, properties, content)))
    assert (frame.code, frame.message, frame.properties, frame.content) == (
        code,
        message,
        properties,
        content,
    )


@settings(max_examples=100, deadline=None)
@given(properties=_props, chunks=st.lists(st.binary(max_size=32), max_size=5), tail=st.binary(max_size=16))
def test_stream_round_trip(properties: dict[str, str], chunks: list[bytes], tail: bytes) -> None:
    data = wire.encode_stream_header(200, "OK", properties)
    data += b"".join(wire.encode_stream_chunk(c, True) for c in chunks) + wire.encode_stream_chunk(
        tail, False
    )
    frame = wire.read_output_frame(io.BytesIO(data + b"trailing"))
    assert frame.properties == properties and frame.chunks is not None
    assert list(frame.chunks) == [(c, True) for c in chunks] + [(tail, False)]


_scalars = st.one_of(
    st.text(max_size=20), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False)
)


@settings(max_examples=150, deadline=None)
@given(record=st.dictionaries(_text, _scalars, max_size=6))
def test_record_round_trip(record: dict[str, object]) -> None:
    assert wire.binary_decode(wire.binary_encode(record)) == {k: str(v) for k, v in record.items()}
