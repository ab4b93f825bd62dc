"""ResponseSink / SinkResponse: chunks written between two sends go out as one HTTP chunk, in order;
a disconnect cancels the sink and ends the response without the final empty chunk."""

from __future__ import annotations

import asyncio
from typing import Any

from djl_handlers.server.sink import BODY_SEND_KEY, ResponseSink, SinkResponse


class _Client:
    """ASGI receive/send pair: records sent messages; ``disconnect()`` ends the receive side."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self._gone = asyncio.Event()
        self.first_body = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body":
            self.first_body.set()

    def disconnect(self) -> None:
        self._gone.set()

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


def test_chunks_written_together_are_one_send_and_keep_order() -> None:
    async def main() -> tuple[list[bytes], list[dict[str, Any]]]:
        done: list[ResponseSink] = []
        sink = ResponseSink(on_done=done.append)
        client = _Client()
        task = asyncio.ensure_future(SinkResponse(sink)({}, client.receive, client.send))
        sink.start(200, {"Content-Type": "application/jsonlines", "Content-Length": "9"})
        sink.write(b"a\n")
        sink.write(b"b\n")  # same tick as a: coalesced
        await client.first_body.wait()
        sink.write(b"c\n")
        sink.write(b"")  # skipped
        sink.finish()
        sink.write(b"late\n")  # after finish: ignored
        await asyncio.wait_for(task, 5)
        assert done == [sink]
        return client.bodies(), client.sent

    bodies, sent = asyncio.run(main())
    assert bodies == [b"a\nb\n", b"c\n"]  # the last chunk carries the end of the body
    assert [m["more_body"] for m in sent[1:]] == [True, False]
    head = sent[0]
    assert head["status"] == 200
    assert (b"content-type", b"application/jsonlines") in head["headers"]
    assert not any(name == b"content-length" for name, _ in head["headers"])  # streamed: chunked
    assert sent[-1]["more_body"] is False


def test_disconnect_cancels_and_ends_without_final_chunk() -> None:
    async def main() -> tuple[ResponseSink, list[bytes], list[str]]:
        events: list[str] = []
        sink = ResponseSink(on_done=lambda s: events.append("done"), on_cancel=lambda s: events.append("cancel"))
        client = _Client()
        task = asyncio.ensure_future(SinkResponse(sink)({}, client.receive, client.send))
        sink.start(200, {})
        sink.write(b"x\n")
        await client.first_body.wait()
        client.disconnect()
        await asyncio.wait_for(task, 5)
        sink.write(b"y\n")
        sink.finish()  # the runtime finishing later is a no-op
        return sink, client.bodies(), events

    sink, bodies, events = asyncio.run(main())
    assert sink.cancelled and sink.done
    assert bodies == [b"x\n"]  # no empty final chunk: the response is abandoned
    assert events == ["cancel", "done"]


def test_disconnect_before_head_gives_499_and_sends_nothing() -> None:
    async def main() -> tuple[ResponseSink, _Client]:
        sink = ResponseSink()
        client = _Client()
        task = asyncio.ensure_future(SinkResponse(sink)({}, client.receive, client.send))
        await asyncio.sleep(0)
        client.disconnect()
        await asyncio.wait_for(task, 5)
        return sink, client

    sink, client = asyncio.run(main())
    assert sink.status == 499 and sink.cancelled
    assert client.sent == []


def test_complete_response_has_content_length_and_completion_does_not_cancel() -> None:
    async def main() -> tuple[ResponseSink, _Client]:
        sink = ResponseSink()
        client = _Client()
        sink.fail(424, b'{"error":"x"}')
        await SinkResponse(sink)({}, client.receive, client.send)
        client.disconnect()  # uvicorn reports the end of a sent response as a disconnect
        await asyncio.sleep(0)
        return sink, client

    sink, client = asyncio.run(main())
    assert not sink.cancelled
    assert client.sent[0]["status"] == 424
    assert (b"content-length", b"13") in client.sent[0]["headers"]
    assert client.bodies() == [b'{"error":"x"}']


def test_streamed_body_goes_to_the_servers_own_send_and_the_head_through_the_app() -> None:
    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        app_side, server_side = _Client(), _Client()
        sink = ResponseSink()
        scope = {BODY_SEND_KEY: server_side.send}
        task = asyncio.ensure_future(SinkResponse(sink)(scope, app_side.receive, app_side.send))
        sink.start(200, {})
        sink.write(b"x")
        await server_side.first_body.wait()
        sink.finish()
        await asyncio.wait_for(task, 5)
        return app_side.sent, server_side.sent

    app_sent, server_sent = asyncio.run(main())
    assert [m["type"] for m in app_sent] == ["http.response.start"]
    assert [(m["body"], m["more_body"]) for m in server_sent] == [(b"x", True), (b"", False)]
