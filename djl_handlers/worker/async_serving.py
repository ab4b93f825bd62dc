"""The worker in DJL's async mode (``--async-mode``): every request frame is awaited on its own.

As DJL's ``PythonAsyncEngine``: the first frame (the init call) is answered before anything else is
read; after it, each frame is handed to the handler as soon as it arrives (``await handle(inputs)``)
and many run at once; every reply ``Output`` — one, or each item of the async generator the handler
returned — is written as soon as it exists, tagged with its request's ``request_tracking_id``.
One asyncio loop does the socket I/O (no reader/writer threads); engines step on their own threads.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
from collections.abc import Callable
from typing import Any

from djl_handlers.errors import message_of, output_error_body
from djl_handlers.extensions import TRACKING_ID_PROPERTY
from djl_handlers.io import wire, wire_inplace
from djl_handlers.io.compat import input_from_frame

__all__ = ["serve_async"]

_LOG = logging.getLogger("djl_handlers.worker")
_READ_SIZE = 1 << 18


class _Collected:
    """A ``sendall`` target that keeps the bytes (an ``Output`` encodes itself by sending)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.parts.append(bytes(data))


def _encoded(output: Any, tracking: str | None) -> bytes:
    """``output`` as one reply frame, tagged with ``tracking``; an error frame if it cannot be encoded."""
    if tracking is not None:
        output.add_property(TRACKING_ID_PROPERTY, tracking)
    sink = _Collected()
    try:
        output.send(sink)
    except Exception as exc:  # noqa: BLE001 - a broken Output must not kill the worker
        _LOG.exception("cannot encode the handler's Output")
        body = output_error_body(424, f"cannot encode the handler's Output: {message_of(exc)}")
        props = {"content-type": "application/json"}
        if tracking is not None:
            props[TRACKING_ID_PROPERTY] = tracking
        import json

        return wire.encode_output_frame(424, "prediction failure", props, [(None, json.dumps(body).encode())])
    return b"".join(sink.parts)


async def _answer(invoke: Callable[[Any], Any], inputs: Any, writer: asyncio.StreamWriter) -> None:
    """Await the handler for one frame and write every reply it produces."""
    tracking = inputs.get_property(TRACKING_ID_PROPERTY)
    result = await invoke(inputs)
    if inspect.isasyncgen(result):
        try:
            async for output in result:
                writer.write(_encoded(output, tracking))
                await writer.drain()
        except Exception as exc:  # noqa: BLE001 - the generator failed mid-stream
            _LOG.exception("async reply generator failed")
            from djl_handlers.worker.loader import map_exception

            writer.write(_encoded(map_exception(exc), tracking))
        return
    writer.write(_encoded(result, tracking))
    await writer.drain()


async def serve_async(conn: socket.socket, invoke: Callable[[Any], Any], extra: dict[str, str],
                      on_init: Callable[[], object] | None = None) -> None:
    """Serve ``conn`` in async mode until the front end closes it (``invoke``: an async function
    Input -> reply, e.g. :meth:`~djl_handlers.worker.loader.HandlerService.invoke_async`)."""
    if conn.family == socket.AF_UNIX:
        reader, writer = await asyncio.open_unix_connection(sock=conn)
    else:
        reader, writer = await asyncio.open_connection(sock=conn)
    limit = wire.max_frame_bytes()
    buffer = b""
    initialized = False
    running: set[asyncio.Task[None]] = set()
    try:
        while True:
            data = await reader.read(_READ_SIZE)
            if not data:
                if buffer:
                    raise ValueError(f"end of stream inside a frame ({len(buffer)} bytes of it read)")
                return
            buffer = buffer + data if buffer else data
            while buffer:
                parsed = wire_inplace.parse_input(buffer, limit)
                if parsed is None:
                    break
                properties, content, size = parsed
                buffer = buffer[size:]
                properties.update(extra)
                inputs = input_from_frame(properties, content)
                if not initialized:  # the init call: the model loads before any request is read
                    await _answer(invoke, inputs, writer)
                    initialized = True
                    if on_init is not None:
                        on_init()
                    continue
                task = asyncio.create_task(_answer(invoke, inputs, writer))
                running.add(task)
                task.add_done_callback(running.discard)
    finally:
        for task in list(running):
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        writer.close()
