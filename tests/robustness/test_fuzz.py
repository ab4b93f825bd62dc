"""Property-based fuzzing of the three layers that read untrusted bytes.

* the wire codec (``read_input_frame`` / ``read_output_frame`` / ``binary_decode``) on arbitrary
  and on mutated valid frames: only ``EOFError`` / ``ValueError`` may come out;
* the request parser on arbitrary JSON-like bodies and arbitrary bytes under random content types:
  only ``InvalidRequest`` subclasses;
* ``GenerationParameters.from_dict`` on arbitrary mappings: only ``InvalidParameter``, and whatever
  it accepts is finite, in range and JSON-serialisable.

CI runs ``max_examples=200`` per property, derandomised (same examples every run). A longer,
random run: ``DJL_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/robustness/test_fuzz.py``
(see docs/robustness.md for its result).
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from djl_handlers.dialects.dispatch import parse_request
from djl_handlers.dialects.openai.request import CHAT_KEYS, COMPLETION_KEYS
from djl_handlers.errors import InvalidParameter, InvalidRequest
from djl_handlers.extensions import API_PROPERTY
from djl_handlers.io import Input
from djl_handlers.io.wire import (
    binary_decode,
    binary_encode,
    encode_input_frame,
    encode_output_frame,
    encode_stream_chunk,
    encode_stream_header,
    read_input_frame,
    read_output_frame,
)
from djl_handlers.params.generation import ALIASES, META_KEYS, GenerationParameters
from djl_handlers.params.translate import known_parameters
from djl_handlers.request.parser import TOP_LEVEL_KEYS, ParserSettings

EXAMPLES = int(os.environ.get("DJL_FUZZ_EXAMPLES", "200"))
LONG_RUN = "DJL_FUZZ_EXAMPLES" in os.environ
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not LONG_RUN,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
MAX_CHUNKS = 10_000  # a corrupt stream cannot make the chunk iterator loop forever on finite input
ENGINES = ("huggingface", "deepspeed", "vllm", "lmi-dist", "tensorrt_llm")

# ------------------------------------------------------------------------------------------------
# strategies

SURROGATES = st.sampled_from(["\ud800", "\udfff", "\udc80"])
CHARS = st.one_of(st.characters(), SURROGATES)
TEXT = st.text(CHARS, max_size=12)
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 2**63, 2**64, 10**30, 0.5, 1e-400, 1e308, -0.0]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)
PARAM_NAMES = sorted(known_parameters() | META_KEYS | set(ALIASES))
TOP_NAMES = sorted(set(TOP_LEVEL_KEYS) | CHAT_KEYS | COMPLETION_KEYS)


def _keyed(names: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(names), TEXT)


PARAMS = st.dictionaries(_keyed(PARAM_NAMES), JSON_VALUES, max_size=6)
MESSAGES = st.lists(st.dictionaries(st.sampled_from(["role", "content", "name"]), JSON_VALUES, max_size=3),
                    max_size=3)
BODIES = st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries({"inputs": JSON_VALUES}, optional={"parameters": st.one_of(PARAMS, JSON_VALUES),
                                                             "stream": JSON_VALUES}),
    st.fixed_dictionaries({"messages": st.one_of(MESSAGES, JSON_VALUES)},
                          optional={k: JSON_VALUES for k in ("max_tokens", "temperature", "stop", "n", "stream",
                                                             "logprobs", "top_logprobs", "stream_options")}),
    st.fixed_dictionaries({"prompt": JSON_VALUES},
                          optional={k: JSON_VALUES for k in ("max_tokens", "echo", "best_of", "logprobs", "seed",
                                                             "top_p", "frequency_penalty")}),
    st.dictionaries(_keyed(TOP_NAMES), JSON_VALUES, max_size=5),
)
CONTENT_TYPES = st.one_of(
    st.none(),
    st.sampled_from(["application/json", "text/plain", "application/jsonlines", "application/octet-stream",
                     "application/json; charset=utf-16", "text/html", "APPLICATION/JSON", "", ";",
                     "application/vnd.x+json", "multipart/form-data", "image/png"]),
    st.text(max_size=20),
)
APIS = st.sampled_from([None, "chat", "completion", "tgi", "tgi_stream", "bogus", ""])


def _chat_template(messages: list[dict[str, Any]]) -> str:
    return "".join(f"<{m['role']}>{m['content']}" for m in messages)


SETTINGS = st.builds(
    ParserSettings,
    engine=st.sampled_from(ENGINES),
    rolling_batch=st.booleans(),
    strict_parameters=st.booleans(),
    max_new_tokens_limit=st.sampled_from([1, 4096, 2**31]),
    chat_template=st.sampled_from([None, _chat_template]),
)

# ------------------------------------------------------------------------------------------------
# wire codec


def _drain(read: Callable[[io.BytesIO], Any], data: bytes) -> None:
    """Read frames until the stream ends, iterating any chunk stream."""
    stream = io.BytesIO(data)
    for _ in range(64):
        frame = read(stream)
        chunks = getattr(frame, "chunks", None)
        if chunks is not None:
            for n, _chunk in enumerate(chunks):
                assert n < MAX_CHUNKS


def _only(allowed: tuple[type[BaseException], ...], func: Callable[[], Any]) -> None:
    try:
        func()
    except allowed:
        pass


@FUZZ
@given(st.binary(max_size=512))
def test_read_input_frame_on_arbitrary_bytes(data: bytes) -> None:
    _only((EOFError, ValueError), lambda: _drain(read_input_frame, data))


@FUZZ
@given(st.binary(max_size=512))
def test_read_output_frame_on_arbitrary_bytes(data: bytes) -> None:
    _only((EOFError, ValueError), lambda: _drain(read_output_frame, data))


@FUZZ
@given(st.binary(max_size=256))
def test_binary_decode_on_arbitrary_bytes(data: bytes) -> None:
    _only((ValueError,), lambda: binary_decode(data))


WIRE_TEXT = st.text(max_size=8)
PROPS = st.dictionaries(WIRE_TEXT, WIRE_TEXT, max_size=4)
CONTENT = st.lists(st.tuples(st.one_of(st.none(), WIRE_TEXT), st.binary(max_size=16)), max_size=4)


@st.composite
def valid_frames(draw: st.DrawFn) -> bytes:
    """Well-formed frames of every kind, concatenated (what a real socket carries)."""
    kind = draw(st.sampled_from(["input", "output", "stream"]))
    if kind == "input":
        return encode_input_frame(draw(PROPS), draw(CONTENT))
    code, message = draw(st.integers(-32768, 32767)), draw(WIRE_TEXT)
    if kind == "output":
        return encode_output_frame(code, message, draw(PROPS), draw(CONTENT))
    chunks = draw(st.lists(st.binary(max_size=8), max_size=3))
    body = b"".join(encode_stream_chunk(c, True) for c in chunks) + encode_stream_chunk(b"", False)
    return encode_stream_header(code, message, draw(PROPS)) + body


@st.composite
def mutated(draw: st.DrawFn, frames: st.SearchStrategy[bytes]) -> bytes:
    """A valid frame with a few bytes flipped, inserted, removed, or cut short."""
    data = bytearray(draw(frames))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and data:
            del data[pos]
        elif op == "truncate":
            del data[pos:]
    return bytes(data)


@FUZZ
@given(mutated(valid_frames()))
def test_readers_on_mutated_frames(data: bytes) -> None:
    _only((EOFError, ValueError), lambda: _drain(read_input_frame, data))
    _only((EOFError, ValueError), lambda: _drain(read_output_frame, data))


@FUZZ
@given(mutated(st.dictionaries(WIRE_TEXT, WIRE_TEXT, max_size=4).map(binary_encode)))
def test_binary_decode_on_mutated_records(data: bytes) -> None:
    _only((ValueError,), lambda: binary_decode(data))


@FUZZ
@given(PROPS, CONTENT)
def test_input_frame_round_trip(props: dict[str, str], content: list[tuple[str | None, bytes]]) -> None:
    assert read_input_frame(io.BytesIO(encode_input_frame(props, content))) == (props, content)


@FUZZ
@given(st.dictionaries(WIRE_TEXT, st.one_of(WIRE_TEXT, st.integers(), st.booleans()), max_size=5))
def test_binary_record_round_trip(record: dict[str, object]) -> None:
    assert binary_decode(binary_encode(record)) == {k: str(v) for k, v in record.items()}


# ------------------------------------------------------------------------------------------------
# request parser


def _item(body: bytes, content_type: str | None, api: str | None) -> Input:
    props: dict[str, str] = {}
    if content_type is not None:
        props["Content-Type"] = content_type
    if api is not None:
        props[API_PROPERTY] = api
    return Input.from_parts(props, [("data", body)])


def _parse_only_invalid_request(body: bytes, content_type: str | None, api: str | None,
                                parser_settings: ParserSettings) -> None:
    try:
        request = parse_request(_item(body, content_type, api), parser_settings)
    except InvalidRequest as exc:
        assert exc.message.strip(), "an error must have a message"
        return
    assert isinstance(request.prompt, str)
    json.dumps(request.params.to_dict(), allow_nan=False)  # accepted values are finite


@FUZZ
@given(BODIES, CONTENT_TYPES, APIS, SETTINGS)
def test_parser_on_json_like_bodies(body: Any, content_type: str | None, api: str | None,
                                    parser_settings: ParserSettings) -> None:
    raw = json.dumps(body, allow_nan=True).encode("utf-8")
    _parse_only_invalid_request(raw, content_type, api, parser_settings)


@FUZZ
@given(st.binary(max_size=256), CONTENT_TYPES, APIS, SETTINGS)
def test_parser_on_arbitrary_bytes(body: bytes, content_type: str | None, api: str | None,
                                   parser_settings: ParserSettings) -> None:
    _parse_only_invalid_request(body, content_type, api, parser_settings)


def test_parser_on_5000_digit_integer() -> None:
    body = b'{"inputs": "x", "parameters": {"seed": ' + b"7" * 5000 + b"}}"
    with pytest.raises(InvalidRequest):
        parse_request(_item(body, "application/json", None), ParserSettings())


# ------------------------------------------------------------------------------------------------
# GenerationParameters.from_dict

PY_VALUES = st.one_of(JSON_VALUES, st.tuples(SCALARS), st.binary(max_size=4), st.sets(st.integers(), max_size=2))
PARAM_MAPS = st.dictionaries(st.one_of(st.sampled_from(PARAM_NAMES), TEXT, st.integers(), st.none()), PY_VALUES,
                             max_size=6)
GOOD_LEANING = st.dictionaries(st.sampled_from(PARAM_NAMES), st.one_of(NUMBERS, st.booleans(), st.none(),
                                                                       st.lists(TEXT, max_size=2)), max_size=5)


def _from_dict_only_invalid_parameter(data: Any, engine: str, strict: bool, limit: int) -> None:
    try:
        params = GenerationParameters.from_dict(data, engine, max_new_tokens_limit=limit, strict=strict)
    except InvalidParameter as exc:
        assert exc.field, "InvalidParameter must name a field"
        return
    values = params.to_dict()
    json.dumps(values, allow_nan=False)
    assert 1 <= params.max_new_tokens <= limit  # the default is capped at the limit too
    assert all(math.isfinite(v) for v in values.values() if isinstance(v, float))
    assert params.min_new_tokens <= params.max_new_tokens


@FUZZ
@given(st.one_of(PARAM_MAPS, GOOD_LEANING, JSON_VALUES), st.sampled_from(ENGINES), st.booleans(),
       st.sampled_from([1, 30, 4096]))
def test_from_dict_raises_only_invalid_parameter(data: Any, engine: str, strict: bool, limit: int) -> None:
    _from_dict_only_invalid_parameter(data, engine, strict, limit)


def test_from_dict_on_huge_integer() -> None:
    with pytest.raises(InvalidParameter):
        GenerationParameters.from_dict({"max_new_tokens": 10**5000})


def test_default_max_new_tokens_respects_a_lower_limit() -> None:
    params = GenerationParameters.from_dict({}, max_new_tokens_limit=10)
    assert params.max_new_tokens <= 10
