"""One request without a server: the front end's loop over a ``protocol.transport.Transport``.

``djl-handlers generate`` uses it with ``worker.in_process.InProcessTransport``; it sends the init call
and then drives the request exactly as the server would: rolling-batch steps until the record says
``last`` (the first step carries headers, body and seed, later ones empty bodies), one
dynamic-batch call whose reply may be streamed, or, in async mode, one awaited call whose replies
each carry a record.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, TextIO

from djl_handlers.protocol.dynamic import batch_frame
from djl_handlers.protocol.messages import BatchFailure, WorkerRequest, reply_of
from djl_handlers.protocol.rolling import FrontEndBatch, FrontEndSlot, Record, decode_record
from djl_handlers.protocol.transport import Transport
from djl_handlers.server.settings import ServerSettings

__all__ = ["drive_dynamic", "drive_rolling", "run_one"]


def _emit(out: TextIO, data: bytes, flush: bool) -> None:
    out.write(data.decode("utf-8", "replace"))
    if flush:
        out.flush()


def _record(out: TextIO, record: Record, status: int | None, flush: bool) -> tuple[int | None, int | None]:
    """Print one record as the front end would; returns ``(status so far, final status or None)``."""
    if record.code is not None:
        _emit(out, record.error_body(), flush)
        return status, status or record.code
    if record.data:
        status = status or 200
        _emit(out, record.data.encode("utf-8"), flush)
    return status, (status or 200) if record.last else None


def drive_rolling(transport: Transport, request: WorkerRequest, handler: str, out: TextIO,
                  flush: bool = False, max_steps: int = 1_000_000) -> int:
    """Step one request to its end; returns the HTTP status it would get."""
    batcher = FrontEndBatch(handler, max_size=1)
    batcher.add(FrontEndSlot(request=request))
    status: int | None = None
    for _ in range(max_steps):
        frame = transport.call(*batcher.build_step())
        try:
            results = batcher.apply(frame)
        except BatchFailure as exc:
            _emit(out, Record(code=exc.code, error=exc.message).error_body(), flush)
            return exc.code
        status, final = _record(out, results[0][1], status, flush)
        if final is not None:
            return final
    return 500


def drive_dynamic(transport: Transport, request: WorkerRequest, handler: str, out: TextIO,
                  flush: bool = False) -> int:
    """One (unbatched) call; a streamed reply is printed chunk by chunk."""
    reply = reply_of(transport.call(*batch_frame([request], handler)))
    if reply.chunks is not None:
        for data, _more in reply.chunks:
            _emit(out, data, flush)
    else:
        _emit(out, reply.body, flush)
    return reply.code


async def drive_async(transport: Any, settings: ServerSettings, request: WorkerRequest, out: TextIO,
                      flush: bool = False) -> int:
    """Async mode: the init call, then one request whose replies are records (``AsyncRequestManager``);
    -1 when the init call failed."""
    async for init in transport.stream_async(settings.init_properties(), []):
        if _init_failed(init):
            return -1
    properties = dict(request.properties, request_tracking_id="generate", handler=settings.handler)
    status: int | None = None
    async for frame in transport.stream_async(properties, request.content):
        if frame.code != 200:
            _emit(out, f"Async Inference Failure {frame.message}".encode(), flush)
            return frame.code
        record = decode_record(bytes(frame.content[0][1])) if frame.content else Record(last=True)
        status, final = _record(out, record, status, flush)
        if final is not None:
            return final
    return status or 200


def _init_failed(init: Any) -> bool:
    """True (and say why on stderr) when the init call's reply is an error."""
    if init.code < 300:
        return False
    detail = b"".join(value for _, value in (init.content or [])).decode("utf-8", "replace")
    print(f"djl-handlers: model initialization failed ({init.code} {init.message}): {detail}", file=sys.stderr)
    return True


def run_one(settings: ServerSettings, transport: Transport, body: bytes, stream: bool,
            out: TextIO = sys.stdout) -> int:
    """Init the handler over ``transport`` (in process for ``djl-handlers generate``), run one request,
    print its body; exit status 0 when < 300."""
    request = WorkerRequest({"content-type": "application/json"}, [("data", body)])
    if settings.async_mode and hasattr(transport, "stream_async"):
        code = asyncio.run(drive_async(transport, settings, request, out, flush=stream))
        if code < 0:
            return 1
    else:
        if _init_failed(transport.call(settings.init_properties(), [])):
            return 1
        if settings.rolling:
            code = drive_rolling(transport, request, settings.handler, out, flush=stream)
        else:
            code = drive_dynamic(transport, request, settings.handler, out, flush=stream)
    out.write("\n")
    out.flush()
    if code >= 300:
        print(f"djl-handlers: the request failed with status {code}", file=sys.stderr)
        return 1
    return 0
