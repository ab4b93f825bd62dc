"""Async mode (DJL's ``PythonAsyncEngine``) on the fake engine: one request per awaited call, the
engine loop on its own thread, the same bytes as the rolling batch."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from djl_handlers.engines.fake import REPLY, FakeEngine
from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncAnswer, AsyncModeClient
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request


def make_client(**options: str) -> tuple[AsyncModeClient, InferenceService, FakeEngine]:
    engine = FakeEngine()
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    return AsyncModeClient(service.handle), service, engine


async def _started(**options: str) -> tuple[AsyncModeClient, InferenceService, FakeEngine]:
    client, service, engine = make_client()
    assert await client.init({"rolling_batch": "disable", **options}) is None
    return client, service, engine


def _answer_alone(payload: dict[str, Any]) -> AsyncAnswer:
    """Async mode's whole answer to ``payload``, the only request of a fresh service."""
    async def main() -> AsyncAnswer:
        client, service, _ = await _started()
        try:
            return await client.request(payload)
        finally:
            assert service.async_mode is not None
            service.async_mode.close()

    return asyncio.run(main())


def _sync_text(payload: dict[str, Any]) -> tuple[str, str]:
    """The rolling batch's answer to ``payload`` (body, content type)."""
    engine = FakeEngine()
    service = InferenceService("huggingface", engine_factory=lambda config: engine)
    driver = RollingBatchDriver(service.handle)
    driver.init({"rolling_batch": "auto"})
    req = driver.submit(json_request(payload))
    driver.run()
    return req.text, req.headers.get("Content-Type", "")


PAYLOADS = [
    {"inputs": "hi", "parameters": {"max_new_tokens": 9, "details": True}},
    {"inputs": "hi", "stream": True, "parameters": {"max_new_tokens": 4}},
    {"inputs": "hi", "stream": True, "parameters": {"max_new_tokens": 5, "details": True}},
    {"inputs": "hello", "parameters": {"max_new_tokens": 6, "stop": ["lo"]}},
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=["json-details", "jsonlines", "jsonlines-details", "stop"])
def test_async_answers_equal_the_rolling_batch_byte_for_byte(payload: dict[str, Any]) -> None:
    answer = _answer_alone(payload)
    text, content_type = _sync_text(payload)
    assert answer.code == 200
    assert answer.text == text
    assert answer.headers["Content-Type"] == content_type


def test_streaming_request_gets_one_reply_per_token_and_an_empty_last_one() -> None:
    """Each token in a record of its own; the closing line too, then an empty last record, so that
    DJL's writer, which can miss a last chunk, can lose nothing (docs/djl-serving.md)."""
    answer = _answer_alone({"inputs": "hi", "stream": True, "parameters": {"max_new_tokens": 4}})
    assert len(answer.records) == 5
    assert [r["last"].lower() for r in answer.records] == ["false"] * 4 + ["true"]
    assert answer.records[-1]["data"] == "" and all(r["data"] for r in answer.records[:4])
    assert [json.loads(x)["token"]["text"] for x in answer.text.splitlines()] == list(REPLY[:4])


@pytest.mark.parametrize("payload", [
    {"inputs": "hi", "parameters": {"max_new_tokens": 3}},
    {"inputs": "hi", "parameters": {"max_new_tokens": 3, "details": True}},
])
def test_a_one_chunk_answer_travels_as_data_then_an_empty_last_record(payload: dict[str, Any]) -> None:
    answer = _answer_alone(payload)
    assert [(r["data"] != "", r["last"].lower()) for r in answer.records] == [(True, "false"), (False, "true")]
    assert json.loads(answer.text)["generated_text"] == REPLY[:3]


def test_a_refusal_stays_one_last_record_with_its_code() -> None:
    """DJL's front end reads a ``code`` only from a last record: a refusal cannot be split."""
    answer = _answer_alone({"inputs": "hi", "parameters": {"max_new_tokens": -1}})
    assert len(answer.records) == 1 and answer.records[0]["last"].lower() == "true"
    assert answer.code == 400 and "max_new_tokens" in (answer.error or "")


def test_concurrent_requests_share_the_batch_and_a_bad_one_gets_400_naming_the_field() -> None:
    async def main() -> list[AsyncAnswer]:
        client, service, engine = await _started()
        answers = await asyncio.gather(
            client.request({"inputs": "a", "parameters": {"max_new_tokens": 6}}),
            client.request({"inputs": "b", "parameters": {"max_new_tokens": -1}}),
            client.request({"inputs": "c", "stream": True, "parameters": {"max_new_tokens": 3}}),
            client.request(b"{not json"),
        )
        service.async_mode.close()  # type: ignore[union-attr]
        return answers

    good, bad, streamed, broken = asyncio.run(main())
    assert json.loads(good.text)["generated_text"] == REPLY[:6]
    assert bad.code == 400 and "max_new_tokens" in (bad.error or "")
    assert json.loads(bad.text) == {"error": bad.error, "code": 400}
    assert json.loads(streamed.text.splitlines()[-1])["generated_text"] == REPLY[:3]
    assert broken.code == 400 and "JSON" in (broken.error or "")


def test_engine_failure_of_one_request_leaves_its_neighbour_running() -> None:
    async def main() -> list[AsyncAnswer]:
        client, service, _ = await _started()
        answers = await asyncio.gather(
            client.request({"inputs": "fine", "parameters": {"max_new_tokens": 5}}),
            client.request({"inputs": "x <fail@2>", "parameters": {"max_new_tokens": 5}}),
        )
        service.async_mode.close()  # type: ignore[union-attr]
        return answers

    ok, bad = asyncio.run(main())
    assert bad.code == 424 and "fake failure" in (bad.error or "")
    assert json.loads(ok.text)["generated_text"] == REPLY[:5]


def test_requests_beyond_max_rolling_batch_size_wait_and_all_finish() -> None:
    async def main() -> tuple[list[AsyncAnswer], int]:
        client, service, engine = await _started(max_rolling_batch_size="2")
        peak = 0

        async def watch() -> None:
            nonlocal peak
            driver = service.async_mode.driver  # type: ignore[union-attr]
            while True:
                peak = max(peak, driver.running)
                await asyncio.sleep(0)

        watcher = asyncio.ensure_future(watch())
        answers = await asyncio.gather(*[
            client.request({"inputs": str(i), "parameters": {"max_new_tokens": 3 + i}}) for i in range(5)])
        watcher.cancel()
        service.async_mode.close()  # type: ignore[union-attr]
        return answers, peak

    answers, peak = asyncio.run(main())
    assert [json.loads(a.text)["generated_text"] for a in answers] == [REPLY[:3 + i] for i in range(5)]
    assert peak <= 2


def test_cancel_frame_finishes_the_request_in_the_engine() -> None:
    async def main() -> tuple[AsyncAnswer, Any, FakeEngine]:
        client, service, engine = await _started()
        answer = AsyncAnswer()
        task = asyncio.ensure_future(client.stream(
            {"inputs": "long", "stream": True, "parameters": {"max_new_tokens": 200}}, answer, tracking_id="t-1"))
        while len(answer.records) < 2:
            await asyncio.sleep(0.001)
        reply = await client.cancel("t-1")
        await asyncio.wait_for(task, 10)
        service.async_mode.close()  # type: ignore[union-attr]
        return answer, reply, engine

    answer, reply, engine = asyncio.run(main())
    assert reply is None
    assert answer.records[-1]["last"].lower() == "true"
    assert len(answer.records) < 200
    assert not engine.has_unfinished()


def test_a_clients_cancel_property_is_inert() -> None:
    """A ``djl_handlers_cancel`` header on an ordinary request (not a ``cancel-`` frame of the front
    end) neither drops that request nor cancels the one it names."""
    async def main() -> tuple[AsyncAnswer, AsyncAnswer, AsyncAnswer]:
        client, service, engine = await _started()
        victim = AsyncAnswer()
        task = asyncio.ensure_future(client.stream(
            {"inputs": "long", "stream": True, "parameters": {"max_new_tokens": 40}}, victim, tracking_id="t-1"))
        while not victim.records:
            await asyncio.sleep(0.001)
        forged = await client.request({"inputs": "x", "parameters": {"max_new_tokens": 4}},
                                      djl_handlers_cancel="t-1")
        own = await client.request({"inputs": "x", "parameters": {"max_new_tokens": 4}},
                                   djl_handlers_cancel="true")
        await asyncio.wait_for(task, 10)
        service.async_mode.close()  # type: ignore[union-attr]
        return victim, forged, own

    victim, forged, own = asyncio.run(main())
    assert forged.json() == own.json() == {"generated_text": REPLY[:4]}
    lines = [json.loads(line) for line in victim.text.splitlines()]
    assert len(lines) == 40 and lines[-1]["generated_text"] == (REPLY * 2)[:40]


def test_closing_the_reply_generator_cancels_the_request() -> None:
    async def main() -> FakeEngine:
        client, service, engine = await _started()
        from djl_handlers.io.inputs import Input

        gen = await service.handle(Input.from_parts(
            {"Content-Type": "application/json", "request_tracking_id": "x"},
            [("data", json.dumps({"inputs": "z", "stream": True, "parameters": {"max_new_tokens": 500}}).encode())]))
        await gen.__anext__()
        await gen.aclose()
        for _ in range(200):
            if not engine.has_unfinished():
                break
            await asyncio.sleep(0.005)
        service.async_mode.close()  # type: ignore[union-attr]
        return engine

    assert not asyncio.run(main()).has_unfinished()


def test_sync_handle_unchanged_without_async_mode() -> None:
    client, service, _ = make_client()
    from djl_handlers.io.inputs import Input

    assert service.handle(Input.from_parts({"rolling_batch": "auto"}, [])) is None
    assert service.async_mode is None


def test_async_mode_detected_from_the_running_loop_when_the_key_is_absent() -> None:
    async def main() -> bool:
        _, service, _ = make_client()
        from djl_handlers.io.inputs import Input

        assert await service.handle(Input.from_parts({"rolling_batch": "disable"}, [])) is None
        found = service.async_mode is not None
        if service.async_mode is not None:
            service.async_mode.close()
        return found

    assert asyncio.run(main())


def test_the_loading_threads_openmp_pool_is_released_before_the_engine_loop_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The steps run on the driver's thread: the init thread's OpenMP pool is freed (djl_handlers/openmp.py)
    once, on the init thread, before the first step."""
    import threading

    import djl_handlers.async_mode as async_mode

    calls: list[str] = []
    monkeypatch.setattr(async_mode, "release_thread_pool", lambda: calls.append(threading.current_thread().name) or 1)

    async def main() -> AsyncAnswer:
        client, service, _ = await _started()
        assert calls == [threading.current_thread().name]
        try:
            return await client.request(PAYLOADS[0])
        finally:
            assert service.async_mode is not None
            service.async_mode.close()

    answer = asyncio.run(main())
    assert REPLY.split()[0] in answer.text
    assert len(calls) == 1
