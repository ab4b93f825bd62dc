"""One HTTP response being produced by the runtime and consumed by the ASGI layer.

The runtime (event-loop thread) calls :meth:`ResponseSink.start`, :meth:`write`, :meth:`finish`,
:meth:`respond` or :meth:`fail`; :class:`SinkResponse` awaits the head, sends it, then relays chunks,
and cancels the sink when the client disconnects. Status and headers are fixed by the first chunk,
as in DJL (a rolling-batch record error before any data sets the status).

Cost per chunk is kept flat (docs/benchmarks.md, "Front end vs DJL Serving's ModelServer"): a write
appends to a list and wakes the one waiting consumer through a bare future (no queue, no task per
chunk); the consumer sends everything that arrived since its last send as one HTTP chunk; a single
watcher task per request turns a client disconnect into :meth:`ResponseSink.cancel`, which wakes the
consumer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BODY_SEND_KEY", "ResponseSink", "SinkResponse", "error_json"]

# The scope key under which the app keeps the server's own ``send`` (server/app.py): a streamed
# body skips the middleware wrappers, which only look at the head.
BODY_SEND_KEY = "djl_handlers.body_send"

_SKIP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})


def error_json(code: int, kind: str, message: str) -> bytes:
    """DJL front-end error body ``{"code", "type", "message"}`` (compact JSON): the one renderer of
    the errors the server itself answers (routing, body limits, queue full, worker died,
    timeouts, shutdown); a request's own errors are rendered by its formatter in the worker."""
    body = {"code": code, "type": kind, "message": message}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _valid_status(code: int) -> int:
    return code if 100 <= code <= 599 else 500


class ResponseSink:
    """Head + body chunks of one response; every method is idempotent after :meth:`finish`."""

    def __init__(self, on_done: Callable[[ResponseSink], None] | None = None,
                 on_cancel: Callable[[ResponseSink], None] | None = None) -> None:
        """``on_done`` runs once when the response is complete (or cancelled)."""
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.full_body: bytes | None = None
        self.started = False
        self.done = False
        self.cancelled = False
        self.slot: Any = None
        self.tracking_id: str | None = None  # async mode: the request_tracking_id the worker knows it by
        self.trace: Any = None  # the runtime's telemetry record (server/telemetry.py)
        self.created = time.monotonic()
        self._on_done = on_done
        self._on_cancel = on_cancel
        self._head = asyncio.Event()
        self._pending: list[bytes] = []
        self._ended = False  # no chunk follows the pending ones
        self._waiter: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ producer side

    def start(self, status: int, headers: dict[str, str]) -> None:
        """Fix the status line and headers (only the first call counts)."""
        if self.started or self.done:
            return
        self.status = _valid_status(status)
        self.headers = dict(headers)
        self.started = True
        self._head.set()

    def write(self, data: bytes) -> None:
        """Queue a body chunk (empty chunks are skipped)."""
        if data and not self.done:
            self._pending.append(bytes(data))
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def finish(self) -> None:
        """End the body; a response that never started becomes an empty 200."""
        if self.done:
            return
        if not self.started:
            self.start(200, {})
        self.done = True
        self._ended = True
        self._wake()
        if self._on_done is not None:
            self._on_done(self)

    def respond(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """A complete, non-streamed response (sent with Content-Length)."""
        if self.started or self.done:
            return
        self.full_body = bytes(body)
        self.start(status, headers)
        self.finish()

    def fail(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        """Finish with an error: as the status and body if nothing was sent yet, else a final chunk.

        ``headers`` are used as given (DJL keeps a rolling request's own Content-Type); without
        them the error is ``application/json``.
        """
        if self.done:
            return
        if not self.started:
            self.respond(code, headers if headers is not None else {"content-type": "application/json"}, body)
            return
        self.write(body)
        self.finish()

    def cancel(self) -> None:
        """The client went away: stop producing; the runtime frees the slot."""
        if self.done:
            return
        self.cancelled = True
        if not self.started:
            self.status = 499
        self.done = True
        self._head.set()
        self._ended = True
        self._wake()
        if self._on_cancel is not None:
            self._on_cancel(self)
        if self._on_done is not None:
            self._on_done(self)

    # ------------------------------------------------------------------ consumer side

    def ended_after_this(self) -> bool:
        """True when the body ended and no chunk is pending (after :meth:`next_chunk`)."""
        return self._ended and not self._pending

    async def wait_head(self) -> None:
        """Wait until the status and headers are known."""
        await self._head.wait()

    async def next_chunk(self) -> bytes | None:
        """Every body chunk written since the last call, joined; ``None`` at the end."""
        while not self._pending:
            if self._ended:
                return None
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter
        pending = self._pending
        if len(pending) == 1:
            data = pending[0]
        else:
            data = b"".join(pending)
        pending.clear()
        return data


def _raw_headers(headers: dict[str, str], length: int | None) -> list[tuple[bytes, bytes]]:
    raw = [(k.lower().encode("latin-1"), str(v).encode("latin-1", "replace"))
           for k, v in headers.items() if k.lower() not in _SKIP_HEADERS]
    if length is not None:
        raw.append((b"content-length", str(length).encode("ascii")))
    return raw


async def _watch_disconnect(receive: Callable[[], Any], sink: ResponseSink) -> None:
    """Cancel ``sink`` when the client goes away (uvicorn also reports the end of a sent response)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            sink.cancel()  # no-op once the response is complete
            return


class SinkResponse:
    """An ASGI response relaying a :class:`ResponseSink`, watching for client disconnects."""

    def __init__(self, sink: ResponseSink) -> None:
        """Wrap ``sink``."""
        self.sink = sink

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Send head and chunks; a disconnect cancels the sink."""
        sink = self.sink
        watcher = asyncio.ensure_future(_watch_disconnect(receive, sink))
        try:
            await sink.wait_head()
            if sink.cancelled or sink.status is None:
                sink.cancel()
                return
            await self._send_all(send, scope.get(BODY_SEND_KEY) or send)
        except OSError:
            sink.cancel()
        finally:
            watcher.cancel()

    async def _send_all(self, send: Any, body_send: Any) -> None:
        """The head through ``send``; a streamed body through ``body_send`` (the server's own send,
        past middleware that only handles the head), the last chunk together with the end."""
        sink = self.sink
        assert sink.status is not None
        no_body = sink.status in (204, 304) or sink.status < 200
        if sink.full_body is not None:
            body = b"" if no_body else sink.full_body
            await send({"type": "http.response.start", "status": sink.status,
                        "headers": _raw_headers(sink.headers, None if no_body else len(body))})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await send({"type": "http.response.start", "status": sink.status,
                    "headers": _raw_headers(sink.headers, None)})
        while True:
            chunk = await sink.next_chunk()
            if sink.cancelled:
                return  # the client went away: no end of body
            if chunk is None:
                break
            last = sink.ended_after_this()
            await body_send({"type": "http.response.body", "body": chunk, "more_body": not last})
            if last:
                return
        await body_send({"type": "http.response.body", "body": b"", "more_body": False})
