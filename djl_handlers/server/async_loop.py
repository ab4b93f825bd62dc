"""The front end's side of DJL's async mode: what Java's ``AsyncRequestManager`` does, on the loop.

Each request goes to the worker as soon as it is taken from the queue, alone, with a fresh
``request_tracking_id``; the worker answers with any number of reply frames per request, in any
order between requests, each tagged with that id. A reply's first content item is a rolling-batch
record: its ``data`` is appended to the HTTP body, ``last`` ends it, a ``code`` before any data is
the status (as ``Request.addResponse``); a reply whose own status is not 200 fails the request with
DJL's ``Async Inference Failure`` body. Nothing limits how many requests the worker holds (as in DJL:
the handler's engine queues what does not fit its batch).

Beyond DJL: a client that goes away, or a request with no reply for ``predict_timeout`` seconds, is
cancelled in the engine with a cancel frame (``extensions.CANCEL_PROPERTY`` naming its tracking id),
and the timed-out client gets a 503. Control calls (adapters) travel the same way, as in DJL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from djl_handlers.extensions import (
    CANCEL_PROPERTY,
    CANCEL_TRACKING_PREFIX,
    ENGINE_STATS_PROPERTY,
    TRACKING_ID_PROPERTY,
)
from djl_handlers.io import wire
from djl_handlers.protocol.rolling import Record, decode_record

if TYPE_CHECKING:
    from djl_handlers.server.runtime import ModelRuntime
    from djl_handlers.server.sink import ResponseSink
    from djl_handlers.server.worker_channel import StepChannel

__all__ = ["AsyncRequests", "async_failure_body"]

_LOG = logging.getLogger("djl_handlers.server")


def async_failure_body(code: int, message: str) -> bytes:
    """DJL's body for an async reply whose status is not 200 (``AsyncRequestManager.sendErrorResponse``)."""
    return json.dumps({"code": code, "message": f"Async Inference Failure {message}"}).encode("utf-8")


@dataclass(eq=False)
class _Held:
    """A request the worker holds: its HTTP response (or a control call's future) and last news."""

    owner: Any  # ResponseSink, or an asyncio.Future for a control call
    last_reply: float
    stats: str | None = None


class AsyncRequests:
    """Tracking ids -> requests on one channel to the worker; owned by the runtime's async loop."""

    def __init__(self, runtime: ModelRuntime) -> None:
        self._runtime = runtime
        self.held: dict[str, _Held] = {}

    def send_request(self, channel: StepChannel, properties: dict[str, str], content: list[tuple[str | None, bytes]],
                     owner: Any) -> str:
        """Send one request (or control call) frame; returns its tracking id."""
        tracking = str(uuid.uuid4())
        props = dict(properties)
        props[TRACKING_ID_PROPERTY] = tracking
        self.held[tracking] = _Held(owner, asyncio.get_running_loop().time())
        channel.send((props, content))
        return tracking

    def send_cancel(self, channel: StepChannel, tracking: str) -> None:
        """Ask the worker to finish ``tracking``'s request in the engine (its reply is ignored)."""
        channel.send(({CANCEL_PROPERTY: tracking, TRACKING_ID_PROPERTY: f"{CANCEL_TRACKING_PREFIX}{uuid.uuid4()}",
                       "handler": self._runtime.settings.handler or "handle"}, [("data", b"")]))

    def take(self, frame: wire.OutputFrame, deliver: Callable[[ResponseSink, Record, dict[str, str]], None]) -> None:
        """Apply one reply frame."""
        tracking = frame.properties.get(TRACKING_ID_PROPERTY, "")
        held = self.held.get(tracking)
        if held is None:
            return  # a cancel frame's own reply, or a request already failed or cancelled
        held.last_reply = asyncio.get_running_loop().time()
        if isinstance(held.owner, asyncio.Future):  # a control call: the reply is its answer
            del self.held[tracking]
            if not held.owner.done():
                held.owner.set_result(frame)
            return
        sink: ResponseSink = held.owner
        headers = {k: v for k, v in frame.properties.items() if k != TRACKING_ID_PROPERTY}
        if frame.code != 200:
            del self.held[tracking]
            sink.fail(frame.code, async_failure_body(frame.code, frame.message), {"Content-Type": "application/json"})
            return
        blob = bytes(frame.content[0][1]) if frame.content else b""
        try:
            record = decode_record(blob)
        except ValueError as exc:
            del self.held[tracking]
            sink.fail(500, async_failure_body(500, f"undecodable reply: {exc}"), {"Content-Type": "application/json"})
            return
        if ENGINE_STATS_PROPERTY.encode() in blob:
            held.stats = wire.binary_decode(blob).get(ENGINE_STATS_PROPERTY)
        telemetry_props = {ENGINE_STATS_PROPERTY: held.stats} if held.stats else {}
        held.stats = None
        self._runtime.telemetry.rolling_step([(_SlotView(sink), record, headers)], telemetry_props, len(self.held))
        if record.last or record.code is not None:
            del self.held[tracking]
        deliver(sink, record, headers)

    def overdue(self, now: float, timeout: float) -> list[str]:
        """Tracking ids of requests with no reply for ``timeout`` seconds."""
        return [t for t, held in self.held.items() if now - held.last_reply > timeout]

    def fail_all(self, code: int, body: Callable[[int, str], bytes], why: str) -> None:
        """The worker is gone: every held request fails (control calls get ``None``)."""
        for held in self.held.values():
            if isinstance(held.owner, asyncio.Future):
                if not held.owner.done():
                    held.owner.set_exception(RuntimeError(why))
            else:
                held.owner.fail(code, body(code, why))
        self.held.clear()


@dataclass
class _SlotView:
    """What telemetry reads of a slot: its owner."""

    owner: Any
