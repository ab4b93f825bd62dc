"""Parity with DJL's own ``djl_python`` Input/Output, when a copy of it is available.

The copy is looked up in env ``DJL_PYTHON_PATH`` (a folder holding the ``djl_python`` package) or in
``tests/djl_serving/lib/python`` (extracted from the DJL jar). Without it every test here skips. The
package is imported only for this module and removed from ``sys.modules``/``sys.path`` afterwards,
so other tests keep seeing our classes.
"""

from __future__ import annotations

import inspect
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from djl_handlers.io import Input, Output, wire
from djl_handlers.testing.sockets import received_input as _read
from djl_handlers.testing.sockets import sent_bytes as _sent

ROOT = Path(__file__).resolve().parents[2]


def _djl_python_dir() -> Path | None:
    candidates = [
        os.environ.get("DJL_PYTHON_PATH", ""),
        str(ROOT / "tests" / "djl_serving" / "lib" / "python"),
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "djl_python" / "inputs.py").is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="module")
def djl() -> Iterator[tuple[ModuleType, ModuleType]]:
    """``(djl_python.inputs, djl_python.outputs)`` from the extracted copy, isolated to this module."""
    folder = _djl_python_dir()
    if folder is None:
        pytest.skip(
            "djl_python not found (set DJL_PYTHON_PATH or extract it to tests/djl_serving/lib/python)"
        )
    saved_path = list(sys.path)
    saved = {m: sys.modules.pop(m) for m in list(sys.modules) if m.split(".")[0] == "djl_python"}
    sys.path.insert(0, str(folder))
    try:
        import importlib

        inputs = importlib.import_module("djl_python.inputs")
        outputs = importlib.import_module("djl_python.outputs")
    except ImportError as exc:
        sys.path[:] = saved_path
        pytest.skip(f"djl_python at {folder} does not import here: {exc}")
    yield inputs, outputs
    sys.path[:] = saved_path
    for name in [m for m in sys.modules if m.split(".")[0] == "djl_python"]:
        del sys.modules[name]
    sys.modules.update(saved)






def _view(item: Any) -> tuple[dict[str, str], list[tuple[Any, bytes]]]:
    content = item.get_content()
    return dict(item.get_properties()), [
        (content.key_at(i), bytes(content.value_at(i))) for i in range(content.size())
    ]


BATCH_FRAME = wire.encode_input_frame(
    {
        "batch_size": "3",
        "handler": "handle",
        "batch_000.Content-Type": "application/json",
        "batch_002.X-Amzn-Id": "z",
        "batch_001_eula": "true",
    },
    [
        ("batch_000.data", b'{"inputs":"a","parameters":{"max_new_tokens":4}}'),
        ("batch_000.seed", b"1234"),
        ("batch_001_data", "é".encode()),
        ("batch_002.data", b"x"),
    ],
)


def test_read_and_get_batches(djl: tuple[ModuleType, ModuleType]) -> None:
    theirs = _read(djl[0].Input, BATCH_FRAME)
    ours = _read(Input, BATCH_FRAME)
    assert _view(ours) == _view(theirs)
    assert ours.get_function_name() == theirs.get_function_name()
    assert (ours.is_batch(), ours.get_batch_size()) == (theirs.is_batch(), theirs.get_batch_size())
    assert [_view(b) for b in ours.get_batches()] == [_view(b) for b in theirs.get_batches()]
    first_ours, first_theirs = ours.get_batches()[0], theirs.get_batches()[0]
    assert first_ours.get_as_json() == first_theirs.get_as_json()
    assert first_ours.get_property("content-type") == first_theirs.get_property("content-type")
    assert str(first_ours) == str(first_theirs)


@pytest.mark.parametrize(
    "record",
    [
        {"data": "He", "last": False},
        {"data": "", "last": True, "code": 424, "error": "bad"},
        {"data": "é\n", "last": True, "content_type": "application/jsonlines", "step_token_num": 3},
    ],
)
def test_binary_encode(djl: tuple[ModuleType, ModuleType], record: dict[str, object]) -> None:
    assert bytes(Output.binary_encode(record)) == bytes(djl[1].Output.binary_encode(record))


def _build(output: Any) -> Any:
    output.add_property("content-type", "application/json")
    output.add_as_json({"generated_text": "héllo", "n": [1, 2.5, None]}, key="data")
    output.add("plain", key="q")
    output.add(b"\x00raw")
    return output


def test_send_non_streaming(djl: tuple[ModuleType, ModuleType]) -> None:
    assert _sent(_build(Output())) == _sent(_build(djl[1].Output()))


def test_send_error(djl: tuple[ModuleType, ModuleType]) -> None:
    ours = Output().error("boom", code=400, message="bad input")
    theirs = djl[1].Output().error("boom", code=400, message="bad input")
    assert _sent(ours) == _sent(theirs)


def _tokens(fail: bool) -> Iterator[Any]:
    yield "He"
    yield {"k": "é"}
    if fail:
        raise RuntimeError("generator failed")
    yield b"end"


@pytest.mark.parametrize("fail", [False, True])
@pytest.mark.parametrize("formatted", [False, True])
def test_send_streaming(djl: tuple[ModuleType, ModuleType], fail: bool, formatted: bool) -> None:
    djl_output = djl[1].Output
    if "output_formatter" not in inspect.signature(djl_output.add_stream_content).parameters:
        pytest.skip("this djl_python has no stream output formatter")
    ours, theirs = Output(), djl_output()
    if formatted:
        ours.add_stream_content(_tokens(fail))
        theirs.add_stream_content(_tokens(fail))
    else:
        ours.add_stream_content(_tokens(fail), output_formatter=None)
        theirs.add_stream_content(_tokens(fail), output_formatter=None)
    mine = _sent(ours)
    assert mine == _sent(theirs)
    frame = wire.read_output_frame(io.BytesIO(mine))
    assert frame.chunks is not None and list(frame.chunks)[-1][1] is False


def test_output_str(djl: tuple[ModuleType, ModuleType]) -> None:
    assert str(_build(Output())) == str(_build(djl[1].Output()))


def test_empty_values_and_null_keys(djl: tuple[ModuleType, ModuleType]) -> None:
    frame = wire.encode_input_frame(
        {"batch_size": "2"}, [("batch_000.data", b""), ("batch_001.data", b"{}"), ("batch_001.seed", b"")]
    )
    theirs, ours = _read(djl[0].Input, frame), _read(Input, frame)
    assert [_view(b) for b in ours.get_batches()] == [_view(b) for b in theirs.get_batches()]
    assert [b.is_empty() for b in ours.get_batches()] == [b.is_empty() for b in theirs.get_batches()]
    single = wire.encode_input_frame({}, [(None, b"n"), ("data", b"")])
    assert _view(_read(Input, single)) == _view(_read(djl[0].Input, single))
    assert _read(Input, single).get_as_bytes() == _read(djl[0].Input, single).get_as_bytes()


def test_private_output_helpers(djl: tuple[ModuleType, ModuleType]) -> None:
    value = {"a": "é", "n": [1, 2.5, None], "nested": {"t": True}}
    assert bytes(Output._encode_json(value)) == bytes(djl[1].Output._encode_json(value))
    formatter = djl[1].Output._default_stream_output_formatter
    assert bytes(Output._default_stream_output_formatter(["x", 1])) == bytes(formatter(["x", 1]))


def test_ndlist_bytes(djl: tuple[ModuleType, ModuleType]) -> None:
    np = pytest.importorskip("numpy")
    if not hasattr(np.ndarray, "newbyteorder"):
        pytest.skip("this djl_python's np_util calls ndarray.newbyteorder, which numpy 2 removed")
    nd = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((1, 2), dtype=np.int64)]
    theirs = djl[1].Output().add_as_numpy(nd, key="x").content.value_at(0)
    assert bytes(Output().add_as_numpy(nd, key="x").content.value_at(0)) == bytes(theirs)
    decoded = djl[0].Input()
    decoded.content.add(key="x", value=bytearray(theirs))
    assert [a.tolist() for a in Input.from_parts({}, [("x", theirs)]).get_as_numpy("x")] == [
        a.tolist() for a in decoded.get_as_numpy("x")
    ]
