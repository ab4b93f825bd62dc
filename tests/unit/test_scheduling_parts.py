"""Direct, table-driven tests of the moving parts: IncrementalDetokenizer, RequestSlot,
RollingBatch, the dynamic batcher, and the front end's side of the protocol (FrontEndBatch,
split_batch, decode_record). The fake engine's byte tokenizer keeps every case exact."""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest

from djl_handlers.dialects.registry import get_formatter
from djl_handlers.engines.base import StepOutput
from djl_handlers.engines.fake import EOS_ID, REPLY, ByteTokenizer, FakeEngine
from djl_handlers.errors import InvalidRequest
from djl_handlers.io import wire
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.protocol.dynamic import split_batch
from djl_handlers.protocol.messages import BatchFailure, WorkerRequest
from djl_handlers.protocol.rolling import FrontEndBatch, FrontEndSlot, decode_record
from djl_handlers.request.records import Request
from djl_handlers.scheduling.detokenizer import IncrementalDetokenizer
from djl_handlers.scheduling.dynamic import run_dynamic_batch
from djl_handlers.scheduling.rolling import RollingBatch
from djl_handlers.scheduling.slot import RequestSlot

TOK = ByteTokenizer()
E_ACUTE = list("é".encode())  # two bytes: the first alone is an incomplete character

# --------------------------------------------------------------------------- detokenizer


@pytest.mark.parametrize(
    ("ids", "pieces", "tail"),
    [
        (list(b"ab"), ["a", "b"], ""),
        ([*E_ACUTE, ord("!")], ["", "é", "!"], ""),  # held back until the character is complete
        (E_ACUTE[:1], [""], "\ufffd"),  # an incomplete character is flushed as is at the end
        ([ord("a"), EOS_ID, ord("b")], ["a", "", "b"], ""),  # special tokens skipped
    ],
)
def test_detokenizer(ids: list[int], pieces: list[str], tail: str) -> None:
    detok = IncrementalDetokenizer(TOK, list(b"prompt "))
    assert [detok.push(i) for i in ids] == pieces
    assert detok.flush() == tail


# --------------------------------------------------------------------------- RequestSlot


def _slot(fmt: str = "jsonlines", stream: bool = True, limit: int = 1 << 30, **params: Any) -> RequestSlot:
    gen = GenerationParameters.from_dict({"max_new_tokens": 4, **params})
    request = Request(prompt="p", params=gen, stream=stream, inputs="p")
    formatter = get_formatter(fmt, stream=stream)
    return RequestSlot(request, formatter, 1, list(b"p"), TOK, frozenset({EOS_ID}), limit)


@pytest.mark.parametrize(
    ("steps", "params", "text", "reason"),
    [
        (list(b"abcdef"), {}, "abcd", "length"),
        ([ord("a"), EOS_ID, ord("b")], {}, "a", "eos_token"),
        ([ord("a"), EOS_ID, ord("b"), ord("c")], {"ignore_eos_token": True}, "abc", "length"),
        # the stop string is removed (docs/parameters.md); include_stop_str_in_output keeps it
        (list(b"xSTOPy"), {"stop_sequences": ["ST"], "max_new_tokens": 6}, "x", "stop_sequence"),
        (list(b"xSTOPy"), {"stop_sequences": ["ST"], "max_new_tokens": 6, "include_stop_str_in_output": True},
         "xST", "stop_sequence"),
    ],
)
def test_slot_stops(steps: list[int], params: dict[str, Any], text: str, reason: str) -> None:
    slot = _slot(**params)
    for token in steps:
        slot.consume(StepOutput(1, token_id=token, log_prob=-0.5))
        if slot.finished:
            break
    assert (slot.output.generated_text, slot.output.finish_reason) == (text, reason)


def test_slot_context_length_caps_max_new_tokens() -> None:
    slot = _slot(limit=3)  # prompt of 1 token: room for 2
    for token in b"abc":
        slot.consume(StepOutput(1, token_id=token))
    assert slot.output.generated_text == "ab" and slot.output.finish_reason == "length"


@pytest.mark.parametrize(
    ("fmt", "stream", "sent_first", "expect_code"),
    [("json", False, False, 424), ("jsonlines", True, False, 424), ("jsonlines", True, True, None)],
)
def test_slot_error_record_before_and_after_data(fmt: str, stream: bool, sent_first: bool,
                                                 expect_code: Optional[int]) -> None:
    slot = _slot(fmt, stream)
    if sent_first:
        slot.consume(StepOutput(1, token_id=ord("a")))
        assert slot.record()["data"]
    slot.consume(StepOutput(1, error="boom"))
    record = slot.record()
    assert record["last"] is True and record.get("code") == expect_code
    if expect_code is None:  # mid-stream: the format's closing line carries the error
        assert json.loads(record["data"])["error"] == "boom"
        assert slot.content_type == "application/jsonlines"
    else:  # before any data: DJL's error record, the status is the code
        assert json.loads(record["data"]) == {"error": "boom", "code": 424}
        assert slot.content_type == "application/json"


# --------------------------------------------------------------------------- RollingBatch


def _request(prompt: str, tokens: int = 3, stream: bool = False) -> Request:
    gen = GenerationParameters.from_dict({"max_new_tokens": tokens})
    return Request(prompt=prompt, params=gen, stream=stream, inputs=prompt)


def _batch(engine: FakeEngine) -> RollingBatch:
    return RollingBatch(engine, lambda r: get_formatter(r.output_formatter, stream=r.stream))


def test_rolling_batch_positions_records_and_releases() -> None:
    engine = FakeEngine()
    batch = _batch(engine)
    batch.add_request(_request("a", 1))
    batch.add_request(_request("b", 2))
    batch.add_error(InvalidRequest("bad body", field="body"))
    first = batch.step()
    assert [r["last"] for r, _ in first] == [True, False, True]
    assert json.loads(first[0][0]["data"]) == {"generated_text": REPLY[:1]}
    assert first[2][0]["code"] == 400 and json.loads(first[2][0]["data"])["error"] == "bad body"
    assert len(batch) == 1 and engine.released == [1]
    second = batch.step()
    assert json.loads(second[0][0]["data"]) == {"generated_text": REPLY[:2]} and len(batch) == 0


def test_rolling_batch_step_crash_fails_members_only_and_cancel_is_silent() -> None:
    engine = FakeEngine()
    batch = _batch(engine)
    batch.add_request(_request("x <crash>"))
    batch.add_request(_request("y"))
    batch.cancel(1)
    results = batch.step()
    assert results[0][0]["code"] == 424 and "crashed" in results[0][0]["error"]
    cancelled = dict(results[1][0])
    assert json.loads(cancelled.pop("djl_handlers_stats"))["finish_reason"] == "cancelled"
    assert cancelled == {"data": "", "last": True, "step_token_num": 0}
    assert not engine.has_unfinished()


# --------------------------------------------------------------------------- dynamic batcher


def test_dynamic_batch_groups_parameters_and_isolates_errors() -> None:
    engine = FakeEngine(max_model_len=16)
    requests = [_request("a", 2), _request("b", 3), _request("x" * 20, 2)]
    bodies = run_dynamic_batch(engine, requests)
    assert bodies[0] == [{"generated_text": REPLY[:2]}]
    assert bodies[1] == [{"generated_text": REPLY[:3]}]
    assert bodies[2]["code"] == 400 and "max_model_len 16" in bodies[2]["error"]


# --------------------------------------------------------------------------- server side of the protocol


def _frame(records: list[dict[str, Any]], code: int = 200, props: Optional[dict[str, str]] = None) -> wire.OutputFrame:
    content: list[tuple[Optional[str], bytes]] = [(f"batch_{i}", wire.binary_encode(r)) for i, r in enumerate(records)]
    return wire.OutputFrame(code, "ok", props or {}, content)


def test_rolling_batcher_sends_bodies_once_and_matches_by_position() -> None:
    batcher = FrontEndBatch(max_size=2)
    a, b = FrontEndSlot(WorkerRequest({"X": "1"}, [("data", b"A")])), FrontEndSlot(WorkerRequest({}, [("data", b"B")]))
    batcher.add(a)
    props, content = batcher.build_step()
    assert props["batch_000.X"] == "1" and content[0] == ("batch_000.data", b"A") and content[1][0] == "batch_000.seed"
    batcher.add(b)
    assert not batcher.has_room()
    props, content = batcher.build_step()
    assert [c for c in content if c[0].endswith("data")] == [("batch_000.data", b""), ("batch_001.data", b"B")]
    results = batcher.apply(_frame([{"data": "x", "last": True}, {"data": "y", "last": False}],
                                   props={"batch_1_Content-Type": "text/plain"}))
    assert [(s is a, r.data, r.last, h) for s, r, h in results][0] == (True, "x", True, {})
    assert results[1][2] == {"Content-Type": "text/plain"} and batcher.slots == [b]


@pytest.mark.parametrize(
    ("frame", "code"),
    [(wire.OutputFrame(424, "boom", {}, []), 424), (wire.OutputFrame(200, "ok", {}, []), 500)],
)
def test_rolling_batcher_failure_arms_reset(frame: wire.OutputFrame, code: int) -> None:
    batcher = FrontEndBatch()
    batcher.add(FrontEndSlot(WorkerRequest({}, [("data", b"A")])))
    batcher.build_step()
    with pytest.raises(BatchFailure) as info:
        batcher.apply(frame)
    assert info.value.code == code and batcher.build_step()[0].get("reset_rollingbatch") == "true"


@pytest.mark.parametrize(
    ("blob", "expected"),
    [
        (wire.binary_encode({"data": "hi", "last": False}), ("hi", False, None, None)),
        (wire.binary_encode({"data": "", "last": True, "code": 400, "error": "bad"}), ("", True, 400, "bad")),
        (b'{"data": "legacy", "last": true}', ("legacy", True, None, None)),
    ],
)
def test_decode_record(blob: bytes, expected: tuple[Any, ...]) -> None:
    record = decode_record(blob)
    assert (record.data, record.last, record.code, record.error) == expected


def test_split_batch_by_key_and_code() -> None:
    frame = wire.OutputFrame(200, "ok", {"batch_1_X": "y", "shared": "s"},
                             [("batch_0.data", b"zero"), ("batch_1.data", b"one")])
    replies = split_batch(frame, 2)
    assert [r.body for r in replies] == [b"zero", b"one"]
    assert replies[1].headers == {"shared": "s", "X": "y"} and replies[0].headers == {"shared": "s"}
    failed = split_batch(wire.OutputFrame(503, "busy", {}, []), 2)
    assert [r.code for r in failed] == [503, 503]
