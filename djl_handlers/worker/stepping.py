"""The worker's half of the worker-driven rolling batch (:mod:`djl_handlers.protocol.worker_steps`).

:class:`FrameReader` reads request frames from the socket into its own buffer, so that the worker can
ask "is a frame waiting?" between steps without blocking. :class:`Stepper` holds the in-flight list
(a :class:`~djl_handlers.protocol.rolling.FrontEndBatch`, the same frames DJL's front end builds),
applies the front end's deltas and runs one step at a time while the list is not empty and the front
end has not paused it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

from djl_handlers.io import wire, wire_inplace
from djl_handlers.io.compat import input_from_frame
from djl_handlers.protocol.messages import BatchFailure, Content
from djl_handlers.protocol.rolling import FrontEndBatch, FrontEndSlot
from djl_handlers.protocol.worker_steps import SLOTS, WINDOW, paused_frame, read_delta

__all__ = ["FrameReader", "Stepper"]

_LOG = logging.getLogger("djl_handlers.worker")
_READ_SIZE = 1 << 18


class FrameReader:
    """Request frames from a connected socket; ``EOFError`` at a clean end, ``ValueError`` if corrupt."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._buffer = b""
        self._limit = wire.max_frame_bytes()

    def next(self, block: bool) -> tuple[dict[str, str], Content] | None:
        """The next frame; with ``block=False`` ``None`` when no whole frame has arrived yet."""
        while True:
            if self._buffer:
                parsed = wire_inplace.parse_input(self._buffer, self._limit)
                if parsed is not None:
                    properties, content, size = parsed
                    self._buffer = self._buffer[size:]
                    return properties, content
            try:
                data = self._conn.recv(_READ_SIZE) if block else self._conn.recv(_READ_SIZE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            if not data:
                if self._buffer:
                    raise ValueError(f"end of stream inside a frame ({len(self._buffer)} bytes of it read)")
                raise EOFError("end of stream")
            self._buffer = self._buffer + data if self._buffer else data


class Stepper:
    """The in-flight list of the worker-driven rolling batch. ``invoke(properties, content)`` runs the
    handler on one step frame and returns the encoded reply; ``send`` writes bytes to the front end."""

    def __init__(self, invoke: Callable[[dict[str, str], Content], Any], encode: Callable[[Any], bytes],
                 send: Callable[[bytes], None], window: int = WINDOW) -> None:
        self._invoke = invoke
        self._encode = encode
        self._send = send
        self.window = window
        self.batch: FrontEndBatch | None = None
        self.paused = False
        self.steps_sent = 0
        self.acked = 0

    @property
    def running(self) -> bool:
        """True while there is a step to run: requests held, not paused, and fewer than ``window``
        replies unacknowledged by the front end."""
        return (self.batch is not None and bool(self.batch.slots) and not self.paused
                and self.steps_sent - self.acked < self.window)

    def take(self, properties: dict[str, str], content: Content) -> None:
        """Apply one delta frame: new requests join the list, cancelled ones are flagged (their next
        record says ``last``), a pause is answered at once."""
        delta = read_delta(properties, content)
        if self.batch is None:
            self.batch = FrontEndBatch(delta.handler, max_size=1 << 30)  # the front end keeps the limit
        batch = self.batch
        batch.handler = delta.handler
        for slot_id, request in delta.new:
            batch.add(FrontEndSlot(request=request, owner=slot_id))
        if delta.cancel:
            cancelled = set(delta.cancel)
            for slot in batch.slots:
                if slot.owner in cancelled:
                    slot.cancelled = True
        if delta.ack is not None:
            self.acked = max(self.acked, delta.ack)
        if delta.pause:
            self.paused = True
            self._send(paused_frame())
        elif delta.resumes:
            self.paused = False

    def step(self) -> Any:
        """Run one step over the list and send its reply (with ``djlh_slots``); returns the handler's
        output (for its ``execute_finalize``). A failed step empties the list (the front end fails the
        same requests) and arms ``reset_rollingbatch`` for the next one."""
        batch = self.batch
        assert batch is not None
        properties, content = batch.build_step()
        ids = ",".join(str(slot.owner) for slot in batch.slots)
        output = self._invoke(properties, content)
        add = getattr(output, "add_property", None)
        if callable(add):
            add(SLOTS, ids)
        data = self._encode(output)
        parsed = wire.parse_output_frame(data)
        if parsed is None:
            raise ValueError("the encoded step reply is incomplete")
        frame = parsed[0]
        if frame.properties.get(SLOTS) != ids:  # an output without add_property: add it here
            frame.properties[SLOTS] = ids
            data = wire.encode_output_frame(frame.code, frame.message, frame.properties, frame.content or [])
        self._send(data)
        self.steps_sent += 1
        try:
            batch.apply(frame)
        except BatchFailure as exc:
            _LOG.warning("rolling step failed (%s): its %d requests are dropped", exc.message, len(batch.slots))
            batch.clear()
        return output


def frame_input(properties: dict[str, str], content: Content, extra: dict[str, str]) -> Any:
    """The handler's ``Input`` for a frame, with the worker's own properties (``device_id``...)."""
    properties.update(extra)
    return input_from_frame(properties, content)
