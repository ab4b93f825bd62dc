"""The handler called in this process through the worker's encode/decode path: the
:class:`~djl_handlers.protocol.transport.Transport` of ``djl-handlers generate``."""

from __future__ import annotations

import inspect
import io
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from djl_handlers.io import wire
from djl_handlers.protocol.messages import Content
from djl_handlers.protocol.transport import BufferSink
from djl_handlers.worker.loader import HandlerService

__all__ = ["InProcessTransport"]


class InProcessTransport:
    """Calls the handler in this process, through the same encode/decode path as the socket.

    The entry point is loaded on the first call with the model directory on ``sys.path``, and
    ``device_id`` is added to every frame like the worker does.
    """

    def __init__(self, entry_point: str, model_dir: str, device_id: str = "-1") -> None:
        """Nothing is imported until the first :meth:`call`."""
        self._service = HandlerService(entry_point, model_dir)
        self._device_id = device_id

    def call(self, properties: Mapping[str, str], content: Content) -> wire.OutputFrame:
        """Run the handler on one frame and decode its reply."""
        from djl_handlers.io.compat import input_from_frame

        raw = wire.encode_input_frame(properties, content)
        props, entries = wire.read_input_frame(io.BytesIO(raw))
        props["device_id"] = self._device_id
        return _decoded(self._service.invoke(input_from_frame(props, entries)))

    async def stream_async(self, properties: Mapping[str, str],
                           content: Content) -> AsyncIterator[wire.OutputFrame]:
        """DJL's async mode: await the handler on one frame and yield each reply it produces."""
        from djl_handlers.io.compat import input_from_frame

        raw = wire.encode_input_frame(properties, content)
        props, entries = wire.read_input_frame(io.BytesIO(raw))
        props["device_id"] = self._device_id
        result = await self._service.invoke_async(input_from_frame(props, entries))
        if inspect.isasyncgen(result):
            async for output in result:
                yield _decoded(output)
        else:
            yield _decoded(result)


def _decoded(output: Any) -> wire.OutputFrame:
    """``output`` through the wire encoding, decoded as the front end reads it."""
    buffer = BufferSink()
    output.send(buffer)
    finalize: Callable[[], Any] | None = getattr(output, "execute_finalize", None)
    if callable(finalize):
        finalize()
    return wire.read_output_frame(io.BytesIO(b"".join(buffer.parts)))
