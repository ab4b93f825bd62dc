"""``Input`` and ``PairList``: djl_python's accessors, batch splitting, reading frames."""

from __future__ import annotations

import io
import json
import socket
import threading

import pytest

from djl_handlers.io import Input, PairList, wire


def _input(properties: dict[str, str], content: list[tuple[str | None, bytes]]) -> Input:
    return Input.from_parts(properties, content)


# ------------------------------------------------------------------------------- PairList


def test_pair_list_order_duplicates_and_none() -> None:
    pairs = PairList()
    pairs.add("a", 1)
    pairs.add("b", None)  # ignored, as in djl_python
    pairs.add("a", 2)
    pairs.add(pair=("c", 3))
    pairs.add("z", 0, index=0)
    pairs.add("empty", b"")  # empty values are kept
    assert pairs.get_keys() == ["z", "a", "a", "c", "empty"]
    assert pairs.get_values() == [0, 1, 2, 3, b""]
    assert pairs.get("a") == 1 and pairs.get("missing") is None
    assert (pairs.key_at(3), pairs.value_at(3), pairs.size()) == ("c", 3, 5)
    assert not pairs.is_empty() and PairList().is_empty()


def test_pair_list_constructors_and_add_all() -> None:
    assert PairList(keys=["a"], values=[1]).get("a") == 1
    with pytest.raises(ValueError, match="mismatch"):
        PairList(keys=["a"], values=[])
    assert PairList(pair_list=[("a", 1), ("b", 2)]).get_keys() == ["a", "b"]
    merged = PairList(pair_map={"x": 9})
    merged.add_all(PairList(pair_list=[("y", 8)]))
    assert list(zip(merged.keys, merged.values, strict=True)) == [("x", 9), ("y", 8)]


# ---------------------------------------------------------------------------------- Input


def test_empty_input() -> None:
    item = Input()
    assert item.is_empty() and not item.is_batch() and item.get_batch_size() == 1
    assert item.get_as_bytes() is None and item.get_data() is None
    assert item.get_function_name() is None and item.get_batches() == [item]


def test_get_property_is_case_insensitive() -> None:
    item = _input({"Content-Type": "application/json", "X-A": "1"}, [])
    assert item.get_property("content-type") == "application/json"
    assert item.get_property("x-a") == "1" and item.get_property("nope") is None


def test_get_as_bytes_key_rules() -> None:
    item = _input({}, [("q", b"first"), ("data", b"body"), (None, b"anon")])
    assert item.get_as_bytes() == b"body"
    assert item.get_as_bytes("q") == b"first"
    assert item.contains_key("q") and not item.contains_key("zz")
    with pytest.raises(KeyError, match="requested data for key:zz is not found!"):
        item.get_as_bytes("zz")
    assert _input({}, [("q", b"first"), ("r", b"x")]).get_as_string() == "first"


def test_get_data_dispatch_on_content_type() -> None:
    body = json.dumps({"inputs": "héllo"}).encode()
    assert _input({"Content-Type": "application/json; charset=utf-8"}, [("data", body)]).get_data() == {
        "inputs": "héllo"
    }
    assert _input({"content-type": "text/plain"}, [("data", "é".encode())]).get_data() == "é"
    raw = _input({"content-type": "application/octet-stream"}, [("data", b"\x00\x01")]).get_data()
    assert raw == b"\x00\x01"
    assert _input({}, [("data", b"x")]).get_data() == b"x"


def test_get_as_npz_and_csv() -> None:
    numpy = pytest.importorskip("numpy")
    buffer = io.BytesIO()
    numpy.savez(buffer, numpy.arange(3), numpy.ones((2, 2)))
    arrays = _input({"content-type": "tensor/npz"}, [("data", buffer.getvalue())]).get_data()
    assert [a.tolist() for a in arrays] == [[0, 1, 2], [[1.0, 1.0], [1.0, 1.0]]]
    rows = _input({}, [("data", b"a,b\n1,2\n")]).get_as_csv()
    assert rows == [{"a": "1", "b": "2"}]


def test_str_lists_properties_then_decoded_content() -> None:
    item = _input({"content-type": "text/plain", "device_id": "-1"}, [("data", b"hi"), ("q", b"x")])
    assert str(item) == "properties: {'content-type': 'text/plain', 'device_id': '-1'}\ndata: hi\nq: x"


# -------------------------------------------------------------------------------- batches


def test_get_batches_splits_dynamic_batch() -> None:
    item = _input(
        {
            "batch_size": "2",
            "handler": "handle",
            "batch_000.Content-Type": "application/json",
            "batch_001.X-Id": "b",
        },
        [("batch_000.data", b'{"inputs":"a"}'), ("batch_001.data", b"B"), ("batch_001.seed", b"7")],
    )
    assert item.is_batch() and item.get_batch_size() == 2
    first, second = item.get_batches()
    assert first.get_properties() == {"Content-Type": "application/json"}
    assert first.get_as_json() == {"inputs": "a"}
    assert second.get_properties() == {"X-Id": "b"}
    assert second.content.get_keys() == ["data", "seed"]
    assert second.get_as_bytes("seed") == b"7"


def test_get_batches_underscore_separator_and_empty_bodies() -> None:
    item = _input(
        {"batch_size": "3", "batch_002_eula": "true"},
        [("batch_000_data", b""), ("batch_001_data", b"x"), ("batch_002_data", b"y")],
    )
    batches = item.get_batches()
    assert len(batches) == 3
    assert batches[0].get_as_bytes() == b"" and not batches[0].is_empty()
    assert batches[2].get_properties() == {"eula": "true"}
    assert all("batch_size" not in b.get_properties() for b in batches)


def test_get_batches_request_without_entries_is_empty() -> None:
    batches = _input({"batch_size": "2"}, [("batch_001.data", b"x")]).get_batches()
    assert batches[0].is_empty() and batches[1].get_as_bytes() == b"x"


@pytest.mark.parametrize(
    ("properties", "content", "match"),
    [
        ({"batch_size": "1"}, [("data", b"x")], "does not start"),
        ({"batch_size": "1"}, [(None, b"x")], "does not start"),
        ({"batch_size": "1"}, [("batch_001.data", b"x")], "outside batch_size"),
        ({"batch_size": "1", "batch_x.y": "1"}, [], "3-digit"),
        ({"batch_size": "1001"}, [], "outside"),
    ],
)
def test_get_batches_rejects_malformed_keys(
    properties: dict[str, str], content: list[tuple[str | None, bytes]], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        _input(properties, content).get_batches()


# ----------------------------------------------------------------------------------- read


def test_read_from_stream_sets_function_name_and_bytearrays() -> None:
    frame = wire.encode_input_frame({"handler": "handle", "a": "1"}, [("data", b"body"), (None, b"n")])
    item = Input()
    item.read(io.BytesIO(frame))
    assert item.get_function_name() == "handle"
    assert item.get_properties() == {"handler": "handle", "a": "1"}
    assert item.content.get_keys() == ["data", None]
    assert all(type(v) is bytearray for v in item.content.get_values())


def test_read_from_socket_until_eof() -> None:
    left, right = socket.socketpair()

    def send() -> None:
        left.sendall(wire.encode_input_frame({"handler": "h"}, [("data", b"x" * 70000)]))
        left.shutdown(socket.SHUT_WR)

    with left, right:
        sender = threading.Thread(target=send)
        sender.start()
        item = Input()
        item.read(right)
        sender.join()
        assert item.get_as_bytes() == b"x" * 70000
        with pytest.raises(EOFError):
            Input().read(right)
