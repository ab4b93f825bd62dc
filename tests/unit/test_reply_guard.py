"""Rolling-batch records shaped for DJL's HTTP writer (scheduling/reply_guard.py): a reply that would
be one last chunk waits until the writer waits for it, a stream's closing line travels apart from its
end, and what the client reads is the same as without the guard."""

from __future__ import annotations

import json
import time

import pytest

from djl_handlers.engines.fake import REPLY, FakeEngine
from djl_handlers.extensions import STEP_TOKENS_KEY
from djl_handlers.scheduling.reply_guard import FIRST_REPLY_HOLD_S, ReplyGuard
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import DriverRequest, RollingBatchDriver, json_request

REFUSAL = {"data": '{"error": "bad"}', "last": True, "code": 400, "error": "bad", STEP_TOKENS_KEY: 0}


def test_a_refusal_waits_until_the_hold_has_passed_then_goes_whole() -> None:
    guard = ReplyGuard(hold_s=0.05)
    guard.arrived(7, now=100.0)
    assert guard.shape(7, dict(REFUSAL), now=100.001) == {"data": "", "last": False, STEP_TOKENS_KEY: 0}
    assert guard.holds(7)
    assert guard.wait_s(now=100.02) == pytest.approx(0.03)
    assert guard.shape(7, {}, now=100.03) == {"data": "", "last": False, STEP_TOKENS_KEY: 0}
    assert guard.shape(7, {}, now=100.06) == REFUSAL
    assert not guard.holds(7) and guard.wait_s(now=100.06) == 0.0


def test_a_one_chunk_answer_after_the_hold_is_not_delayed() -> None:
    guard = ReplyGuard(hold_s=0.05)
    guard.arrived(1, now=10.0)
    answer = {"data": '{"generated_text": "x"}', "last": True, STEP_TOKENS_KEY: 1}
    assert guard.shape(1, dict(answer), now=10.2) == answer
    assert not guard.holds(1)


def test_a_streams_closing_line_is_sent_apart_from_its_end() -> None:
    guard = ReplyGuard(hold_s=0.05)
    guard.arrived(3, now=0.0)
    first = {"data": "a\n", "last": False, STEP_TOKENS_KEY: 1}
    assert guard.shape(3, dict(first), now=0.001) == first  # not last: untouched, even early
    closing = {"data": "b\n", "last": True, STEP_TOKENS_KEY: 1, "djl_handlers_stats": "{}"}
    assert guard.shape(3, dict(closing), now=0.002) == {"data": "b\n", "last": False, STEP_TOKENS_KEY: 1}
    assert guard.holds(3)
    assert guard.wait_s(now=0.002) == 0.0  # a split end is due at once, not held
    assert guard.shape(3, {}, now=0.003) == {"data": "", "last": True, STEP_TOKENS_KEY: 0, "djl_handlers_stats": "{}"}
    assert not guard.holds(3)


def test_a_stream_error_after_data_without_code_is_split_and_one_with_code_is_not() -> None:
    guard = ReplyGuard(hold_s=0.05)
    guard.arrived(4, now=0.0)
    guard.shape(4, {"data": "a\n", "last": False}, now=0.0)
    coded = {"data": "", "last": True, "code": 500, "error": "x"}
    assert guard.shape(4, dict(coded), now=0.001) == coded


def _driver(monkeypatch: pytest.MonkeyPatch, guarded: bool) -> RollingBatchDriver:
    monkeypatch.setattr("djl_handlers.service.in_djl_worker", lambda: guarded)
    engine = FakeEngine()
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    driver = RollingBatchDriver(service.handle)
    assert driver.init({"rolling_batch": "auto"}) is None
    guard = service.rolling.guard if service.rolling is not None else None
    assert (guard is not None) == guarded
    return driver


def _mixed() -> list[DriverRequest]:
    return [
        json_request({"inputs": "a", "parameters": {"max_new_tokens": 5}}),
        json_request({"inputs": "b", "stream": True, "parameters": {"max_new_tokens": 4, "details": True}}),
        json_request({"inputs": "c", "parameters": {"max_new_tokens": "x"}}),
        json_request({"inputs": ["c", "d"], "parameters": {"max_new_tokens": 2}}),
        json_request({"inputs": "e", "parameters": {"max_new_tokens": 1}}),
        json_request({"inputs": "f", "stream": True, "parameters": {"max_new_tokens": 1}}),
    ]


def test_clients_read_the_same_replies_with_and_without_the_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    replies = []
    for guarded in (False, True):
        driver = _driver(monkeypatch, guarded)
        requests = [driver.submit(r) for r in _mixed()]
        driver.run()
        assert all(r.done for r in requests)
        replies.append([(r.text, r.code, r.error, r.headers.get("Content-Type")) for r in requests])
    assert replies[0] == replies[1]
    assert replies[1][0][0] == json.dumps({"generated_text": REPLY[:5]})
    assert [c for _, c, _, _ in replies[1]] == [None, None, 400, 400, None, None]


def test_with_the_guard_no_reply_is_one_early_last_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _driver(monkeypatch, True)
    begin = time.monotonic()
    requests = [driver.submit(r) for r in _mixed()]
    driver.run()
    took = time.monotonic() - begin
    for request in requests:
        with_data = [r for r in request.records if r.get("data") or "code" in r]
        last = request.records[-1]
        assert str(last.get("last")).lower() == "true"
        if len(with_data) > 1:  # a stream (or an answer after a stream's data): its end carries no data
            assert last.get("data", "") == "" and "code" not in last, request.records
    assert took >= FIRST_REPLY_HOLD_S  # the refusals and one-token answers waited for the hold
    assert driver.steps < 40  # waited by sleeping, not by spinning steps
