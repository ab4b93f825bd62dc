"""Dynamic batching as DJL's Java side does it (``PyProcess.predict``, ``PyPredictor.batchPredict``):
one request alone or several as one frame with ``batch_NNN.`` prefixes, and the reply split back into
one reply per request (a batch code >= 300 goes to every request)."""

from __future__ import annotations

import re

from djl_handlers.extensions import STATUS_PROPERTY
from djl_handlers.io import wire
from djl_handlers.protocol.messages import (
    BatchFailure,
    Content,
    Frame,
    Reply,
    WorkerRequest,
    batch_prefix,
    body_of,
    reply_of,
    split_properties,
)

__all__ = ["batch_frame", "looks_like_record", "single_frame", "split_batch"]

_BATCH_KEY = re.compile(r"batch_(\d+)\.(.*)", re.DOTALL)


def single_frame(request: WorkerRequest, handler: str) -> Frame:
    """A lone request: its own properties (+ ``handler``) and content, no batch keys."""
    properties = dict(request.properties)
    properties.setdefault("handler", handler)
    return properties, list(request.content)


def batch_frame(requests: list[WorkerRequest], handler: str) -> Frame:
    """Several requests as one dynamic batch; a single request is sent unbatched, as DJL does."""
    if len(requests) == 1:
        return single_frame(requests[0], handler)
    properties: dict[str, str] = {"handler": handler}
    content: Content = []
    for index, request in enumerate(requests):
        prefix = batch_prefix(index)
        for name, value in request.properties.items():
            properties[prefix + name] = value
        for key, blob in request.content:
            content.append((prefix + (key or "data"), blob))
    properties["batch_size"] = str(len(requests))
    return properties, content


def looks_like_record(reply: Reply) -> bool:
    """True when a dynamic-batch reply is really a rolling-batch record (``binary_encode`` map).

    That happens only when the handler runs rolling batch while the front end runs dynamic
    batching; the server must then answer a clear error, never the record's bytes.
    """
    if reply.chunks is not None or reply.code >= 300 or len(reply.body) < 8 or reply.body[:1] != b"\x00":
        return False
    if any(key.lower() == "content-type" for key in reply.headers):
        return False
    try:
        fields = wire.binary_decode(reply.body)
    except Exception:  # noqa: BLE001 - not a record: a custom handler's own bytes
        return False
    return "data" in fields and "last" in fields


def split_batch(frame: wire.OutputFrame, size: int) -> list[Reply]:
    """``PyPredictor``'s split of a dynamic-batch reply into ``size`` replies.

    Content keys must be ``batch_{i}.<key>``; a code >= 300 goes to every request unchanged.
    ``batch_{i}_<name>`` properties (an extension DJL's dynamic batch lacks) become request i's
    headers only, so per-request Content-Type works.
    """
    if size == 1:
        return [reply_of(frame)]
    if frame.chunks is not None:
        raise BatchFailure(500, "the handler streamed a reply to a batch of requests")
    content = frame.content or []
    if frame.code >= 300:
        return [Reply(frame.code, frame.message, dict(frame.properties), body_of(content)) for _ in range(size)]
    if len(content) != size:
        raise BatchFailure(500, f"Batch output size mismatch, expected: {size}, actual: {len(content)}")
    shared, per = split_properties(frame.properties, size)
    entries: list[Content] = [[] for _ in range(size)]
    for key, value in content:
        match = _BATCH_KEY.fullmatch(key or "")
        if not match or int(match.group(1)) >= size:
            raise BatchFailure(500, f"Unexpected batch output key: {key}")
        entries[int(match.group(1))].append((match.group(2), value))
    return [_item_reply(frame, shared, per[i], entries[i]) for i in range(size)]


def _item_reply(frame: wire.OutputFrame, shared: dict[str, str], own: dict[str, str], content: Content) -> Reply:
    """Request i's reply: its own status when the handler set ``batch_{i}_`` + ``STATUS_PROPERTY``."""
    status = own.pop(STATUS_PROPERTY, None)
    code = int(status) if status and status.isdigit() else frame.code
    return Reply(code, frame.message, {**shared, **own}, body_of(content))
