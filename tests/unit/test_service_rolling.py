"""The rolling-batch pipeline (parser → scheduler → formatter → records) on the fake engine,
driven the way DJL's Java front end drives it."""

from __future__ import annotations

import json

import pytest

from djl_handlers.engines.fake import REPLY, FakeEngine
from djl_handlers.service import InferenceService
from djl_handlers.testing.java_loop import DriverRequest, RollingBatchDriver, json_request


def make_driver(**options: str) -> tuple[RollingBatchDriver, FakeEngine]:
    engine = FakeEngine()
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    driver = RollingBatchDriver(service.handle)
    assert driver.init({"rolling_batch": "auto", **options}) is None
    return driver, engine


def test_json_response_has_generated_text_and_details() -> None:
    driver, _ = make_driver()
    req = driver.submit(json_request({"inputs": "hi", "parameters": {"max_new_tokens": 9, "details": True}}))
    driver.run()
    body = json.loads(req.text)
    assert body["generated_text"] == REPLY[:9]
    assert body["details"]["finish_reason"] == "length"
    assert body["details"]["generated_tokens"] == 9
    assert body["details"]["inputs"] == "hi"
    assert [t["text"] for t in body["details"]["tokens"]] == list(REPLY[:9])
    assert req.headers["Content-Type"] == "application/json"


def test_jsonlines_stream_one_line_per_token_and_final_line() -> None:
    driver, _ = make_driver()
    req = driver.submit(json_request({"inputs": "hi", "stream": True, "parameters": {"max_new_tokens": 4}}))
    driver.run()
    lines = [json.loads(x) for x in req.text.splitlines()]
    assert len(lines) == 4
    assert [line["token"]["text"] for line in lines] == list(REPLY[:4])
    assert lines[-1]["generated_text"] == REPLY[:4]
    assert "generated_text" not in lines[0]
    assert req.headers["Content-Type"] == "application/jsonlines"


def test_requests_joining_later_do_not_disturb_others() -> None:
    driver, _ = make_driver()
    a = driver.submit(json_request({"inputs": "a", "parameters": {"max_new_tokens": 6}}))
    driver.step()
    driver.step()
    b = driver.submit(json_request({"inputs": "b", "parameters": {"max_new_tokens": 3}}))
    driver.step()
    c = driver.submit(json_request({"inputs": "c", "parameters": {"max_new_tokens": 5}}))
    driver.run()
    assert [json.loads(r.text)["generated_text"] for r in (a, b, c)] == [REPLY[:6], REPLY[:3], REPLY[:5]]


def test_bad_request_gets_its_own_error_and_neighbours_finish() -> None:
    driver, _ = make_driver()
    good = driver.submit(json_request({"inputs": "ok", "parameters": {"max_new_tokens": 3}}))
    bad = driver.submit(DriverRequest(b"{not json", {"Content-Type": "application/json"}))
    driver.run()
    assert bad.code == 400 and "not valid JSON" in (bad.error or "")
    assert json.loads(good.text)["generated_text"] == REPLY[:3]


def test_step_failure_of_one_request_leaves_others_running() -> None:
    driver, _ = make_driver()
    ok = driver.submit(json_request({"inputs": "fine", "parameters": {"max_new_tokens": 5}}))
    bad = driver.submit(json_request({"inputs": "x <fail@2>", "parameters": {"max_new_tokens": 5}}))
    driver.run()
    assert bad.code == 424 and "fake failure" in (bad.error or "")
    assert json.loads(ok.text)["generated_text"] == REPLY[:5]


def test_whole_step_crash_fails_members_and_batch_recovers() -> None:
    driver, engine = make_driver()
    crash = driver.submit(json_request({"inputs": "<crash>"}))
    driver.run()
    assert crash.code == 424 and "crashed" in (crash.error or "")
    later = driver.submit(json_request({"inputs": "after", "parameters": {"max_new_tokens": 2}}))
    driver.run()
    assert json.loads(later.text)["generated_text"] == REPLY[:2]
    assert not engine.has_unfinished()


def test_eos_finishes_with_eos_token() -> None:
    driver, _ = make_driver()
    req = driver.submit(json_request({"inputs": "q <eos@3>", "parameters": {"max_new_tokens": 10, "details": True}}))
    driver.run()
    body = json.loads(req.text)
    assert body["details"]["finish_reason"] == "eos_token"
    assert body["generated_text"] == REPLY[:2]
    assert body["details"]["generated_tokens"] == 3


def test_stop_sequence_across_tokens_is_reported_and_cut() -> None:
    """The stop string is removed (docs/parameters.md); include_stop_str_in_output keeps it."""
    for keep, text in ((False, "The quick "), (True, "The quick brown")):
        driver, _ = make_driver()
        params = {"max_new_tokens": 30, "stop_sequences": ["brown"], "details": True,
                  "include_stop_str_in_output": keep}
        req = driver.submit(json_request({"inputs": "q", "parameters": params}))
        driver.run()
        body = json.loads(req.text)
        assert body["generated_text"] == text
        assert "".join(t["text"] for t in body["details"]["tokens"]) == text
        assert body["details"]["finish_reason"] == "stop_sequence"


def test_return_full_text_prefixes_prompt_escaped() -> None:
    driver, _ = make_driver()
    prompt = 'say "hi"\n'
    req = driver.submit(json_request({"inputs": prompt, "parameters": {"max_new_tokens": 3, "return_full_text": True}}))
    driver.run()
    assert json.loads(req.text)["generated_text"] == prompt + REPLY[:3]


def test_same_seed_same_text_different_seed_differs() -> None:
    driver, _ = make_driver()
    p = {"do_sample": True, "max_new_tokens": 12}
    a = driver.submit(json_request({"inputs": "x", "parameters": {**p, "seed": 7}}))
    b = driver.submit(json_request({"inputs": "y", "parameters": {**p, "seed": 7}}))
    c = driver.submit(json_request({"inputs": "z", "parameters": {**p, "seed": 8}}))
    driver.run()
    texts = [json.loads(r.text)["generated_text"] for r in (a, b, c)]
    assert texts[0] == texts[1] != texts[2]


def test_cancel_property_frees_the_slot_within_one_step() -> None:
    driver, engine = make_driver()
    req = driver.submit(json_request({"inputs": "long", "parameters": {"max_new_tokens": 500}}))
    driver.step()
    req.cancel = True
    driver.step()
    assert req.done and not driver.active
    assert not engine.has_unfinished()


def test_reset_rollingbatch_drops_in_flight_requests() -> None:
    driver, engine = make_driver()
    driver.submit(json_request({"inputs": "a", "parameters": {"max_new_tokens": 50}}))
    driver.step()
    driver.active = []
    driver.reset_next = True
    fresh = driver.submit(json_request({"inputs": "b", "parameters": {"max_new_tokens": 2}}))
    driver.run()
    assert json.loads(fresh.text)["generated_text"] == REPLY[:2]
    assert not engine.has_unfinished()


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"parameters": {}}, "inputs"),
        ({"inputs": ["a", "b"]}, "inputs"),
        ({"inputs": "x", "parameters": {"temperature": -1}}, "temperature"),
        ({"inputs": "x", "parameters": "hot"}, "parameters"),
        ({"inputs": "x", "stream": "yes"}, "stream"),
        ({"inputs": "x", "bogus": 1}, "bogus"),
    ],
)
def test_invalid_requests_name_the_field(payload: dict, field: str) -> None:
    driver, _ = make_driver()
    req = driver.submit(json_request(payload))
    driver.run()
    assert req.code == 400
    assert field in (req.error or "")


def test_prompt_longer_than_model_allows() -> None:
    engine = FakeEngine(max_model_len=16)
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    driver = RollingBatchDriver(service.handle)
    driver.init({"rolling_batch": "auto"})
    long = driver.submit(json_request({"inputs": "x" * 40}))
    short = driver.submit(json_request({"inputs": "x" * 40, "parameters": {"truncate": 8, "max_new_tokens": 3}}))
    driver.run()
    assert long.code == 400 and "max_model_len" in (long.error or "")
    assert json.loads(short.text)["generated_text"] == REPLY[:3]


def test_multibyte_text_is_never_split() -> None:
    engine = FakeEngine(reply="héllo wörld 日本 ")
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    driver = RollingBatchDriver(service.handle)
    driver.init({"rolling_batch": "auto"})
    req = driver.submit(json_request({"inputs": "x", "stream": True, "parameters": {"max_new_tokens": 13}}))
    driver.run()
    lines = [json.loads(x) for x in req.text.splitlines()]
    assert all("\ufffd" not in line["token"]["text"] for line in lines)
    assert lines[-1]["generated_text"] == "héllo wörld"
