"""The front end's side of DJL's worker protocol, without any I/O: what DJL's Java code does.

* :func:`single_frame` / :func:`batch_frame` / :func:`split_batch` — ``PyProcess.predict`` and
  ``PyPredictor.batchPredict`` (dynamic batching, ``batch_NNN.`` prefixes, one reply per request,
  a batch code >= 300 goes to every request);
* :class:`FrontEndBatch` — ``RollingBatch.java``'s step loop state: the whole in-flight list every
  step, properties/body/seed only on a request's first step and empty bodies afterwards,
  ``reset_rollingbatch=true`` after a failure, positional identity, ``batch_{i}_<name>`` reply
  properties as that request's headers, records with ``data``/``last``/``code``/``error``;
* :class:`Transport` — "send one frame, get one reply", implemented over a worker socket
  (:mod:`.worker_process`) or in process (:class:`InProcessTransport`), so the local server and
  ``djl-handlers generate`` share this module.

Extension (ignored by DJL's own worker): a slot whose client went away carries property
``batch_NNN.djl_handlers_cancel=true`` on every later step until its record says ``last``.
"""

from __future__ import annotations

import io
import json
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from djl_handlers.errors import record_error_body
from djl_handlers.extensions import CANCEL_PROPERTY, STATS_RECORD_KEY
from djl_handlers.io import wire

__all__ = [
    "CANCEL_PROPERTY",
    "BatchFailure",
    "BufferSink",
    "FrontEndBatch",
    "FrontEndSlot",
    "InProcessTransport",
    "Record",
    "Reply",
    "Transport",
    "WorkerRequest",
    "batch_frame",
    "body_of",
    "decode_record",
    "reply_of",
    "single_frame",
    "split_batch",
    "step_records",
]


_BATCH_KEY = re.compile(r"batch_(\d+)\.(.*)", re.DOTALL)
_BATCH_PROP = re.compile(r"batch_(\d+)_(.+)", re.DOTALL)

Content = list[tuple[str | None, bytes]]
Frame = tuple[dict[str, str], Content]


class Transport(Protocol):
    """One request frame in, one reply frame out; callers never overlap calls."""

    def call(self, properties: Mapping[str, str], content: Content) -> wire.OutputFrame:
        """Send a frame and read the reply (a streaming reply's chunks are read lazily)."""
        ...


@dataclass
class WorkerRequest:
    """One HTTP request as DJL's ``Input``: headers as properties, body as ``data``, query entries."""

    properties: dict[str, str]
    content: Content

    def data(self) -> bytes:
        """DJL's ``Input.getData()``: the ``data`` entry, else the first entry, else empty."""
        for key, value in self.content:
            if key == "data":
                return value
        return self.content[0][1] if self.content else b""


@dataclass
class Reply:
    """What one HTTP request gets back from a non-rolling call."""

    code: int
    message: str
    headers: dict[str, str]
    body: bytes = b""
    chunks: Iterator[tuple[bytes, bool]] | None = None


def _prefix(index: int) -> str:
    """``batch_007.``: DJL pads the index to three digits (Python reads characters 6-8)."""
    return f"batch_{index:03d}."


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
        prefix = _prefix(index)
        for name, value in request.properties.items():
            properties[prefix + name] = value
        for key, blob in request.content:
            content.append((prefix + (key or "data"), blob))
    properties["batch_size"] = str(len(requests))
    return properties, content


def body_of(content: Content) -> bytes:
    """The HTTP body DJL takes from reply content: entry ``data``, else the first, else empty."""
    for key, value in content:
        if key == "data":
            return value
    return content[0][1] if content else b""


def reply_of(frame: wire.OutputFrame) -> Reply:
    """A non-batch reply frame as one HTTP reply."""
    return Reply(frame.code, frame.message, dict(frame.properties), body_of(frame.content or []), frame.chunks)


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


class BatchFailure(Exception):
    """A reply that breaks the protocol (wrong record count, unknown key...): fails the whole batch."""

    def __init__(self, code: int, message: str) -> None:
        """``code`` is the HTTP status every request of the batch gets."""
        super().__init__(message)
        self.code = code
        self.message = message
        self.slots: list[FrontEndSlot] = []  # the requests it fails, where the caller needs them


def _split_properties(properties: Mapping[str, str], size: int) -> tuple[dict[str, str], list[dict[str, str]]]:
    """Shared properties and per-request ones (``batch_{i}_<name>``, index < size)."""
    shared: dict[str, str] = {}
    per: list[dict[str, str]] = [{} for _ in range(size)]
    for key, value in properties.items():
        match = _BATCH_PROP.fullmatch(key)
        if match and int(match.group(1)) < size:
            per[int(match.group(1))][match.group(2)] = value
        else:
            shared[key] = value
    return shared, per


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
    shared, per = _split_properties(frame.properties, size)
    entries: list[Content] = [[] for _ in range(size)]
    for key, value in content:
        match = _BATCH_KEY.fullmatch(key or "")
        if not match or int(match.group(1)) >= size:
            raise BatchFailure(500, f"Unexpected batch output key: {key}")
        entries[int(match.group(1))].append((match.group(2), value))
    return [
        Reply(frame.code, frame.message, {**shared, **per[i]}, body_of(entries[i])) for i in range(size)
    ]


@dataclass
class Record:
    """One rolling-batch record (``Output.binary_encode``) for one slot."""

    data: str = ""
    last: bool = False
    code: int | None = None
    error: str | None = None
    tokens: int = 1
    stats: str | None = None  # the last record's ``djl_handlers_stats`` JSON (see ``extensions``)

    def error_body(self) -> bytes:
        """The body for a record carrying ``code``: the handler's own rendering (``data``, in the
        request's API dialect) when it sent one, else DJL's compact ``{"error":..,"code":..}``
        (a handler written against djl_python's API). The server renders no dialect itself."""
        if self.data:
            return self.data.encode("utf-8")
        return record_error_body(self.code, self.error).encode("utf-8")


def decode_record(blob: bytes) -> Record:
    """Decode a record: the binary layout, or DJL 0.23's JSON ``{"data", "last"}`` form."""
    if blob[:1] == b"{":
        legacy = json.loads(blob.decode("utf-8"))
        return Record(data=str(legacy.get("data", "")), last=bool(legacy.get("last", False)))
    fields = wire.binary_decode(blob)
    code = fields.get("code")
    data = fields.get("data", "")
    try:  # DJL's step_token_num; a handler without it: one token per record with data
        tokens = int(fields.get("step_token_num", "1" if data else "0"))
    except ValueError:
        tokens = 1 if data else 0
    return Record(
        data=data,
        last=fields.get("last", "").lower() == "true",
        code=int(code) if code not in (None, "") else None,
        error=fields.get("error"),
        tokens=tokens,
        stats=fields.get(STATS_RECORD_KEY),
    )


@dataclass(eq=False)
class FrontEndSlot:
    """One request in the front end's rolling batch (the handler's side of a request is
    ``scheduling.slot.RequestSlot``). ``owner`` is whatever the driver attaches (an HTTP sink)."""

    request: WorkerRequest
    owner: Any = None
    seed: str = field(default_factory=lambda: str(random.randint(0, 2**31 - 1)))
    started: bool = False
    cancelled: bool = False
    finished: bool = False
    slot_id: str = ""  # its id in a worker-driven batch (server.worker_steps)


def step_records(frame: wire.OutputFrame, size: int) -> tuple[list[Record], list[dict[str, str]]]:
    """A rolling step's reply for ``size`` requests: one record and one header dict per request, by
    position; :class:`BatchFailure` when the reply is not a 200 with one decodable record each."""
    content = frame.content
    if frame.code != 200 or content is None or len(content) != size:
        if frame.code != 200:
            raise BatchFailure(frame.code, f"Batch inference failed: {frame.message}")
        actual = "a stream" if content is None else len(content)
        raise BatchFailure(500, f"Batch output size mismatch, expected: {size}, actual: {actual}")
    _, per = _split_properties(frame.properties, size)
    try:
        records = [decode_record(blob) for _, blob in content]
    except (ValueError, KeyError) as exc:
        raise BatchFailure(500, f"Batch inference failed: undecodable record: {exc}") from exc
    return records, per


class FrontEndBatch:
    """``RollingBatch.java``'s list and frame building, driven by the caller one step at a time:
    the front end's half of the rolling batch (the handler's half is ``scheduling.rolling.RollingBatch``;
    ``testing.java_loop.RollingBatchDriver`` emulates this half in process for tests)."""

    def __init__(self, handler: str = "handle", max_size: int = 32) -> None:
        """``max_size`` is ``max_rolling_batch_size``; the caller checks :meth:`has_room`."""
        self.handler = handler
        self.max_size = max_size
        self.slots: list[FrontEndSlot] = []
        self.reset = False

    def has_room(self) -> bool:
        """True when another request may join the batch."""
        return len(self.slots) < self.max_size

    def add(self, slot: FrontEndSlot) -> None:
        """Append a new request; it is sent with its properties, body and seed on the next step."""
        self.slots.append(slot)

    def build_step(self) -> Frame:
        """The frame for the next step over the whole in-flight list."""
        properties: dict[str, str] = {}
        content: Content = []
        if self.reset:
            properties["reset_rollingbatch"] = "true"
            self.reset = False
        for index, slot in enumerate(self.slots):
            prefix = _prefix(index)
            if not slot.started:
                for key, value in slot.request.properties.items():
                    properties[prefix + key] = value
                content.append((prefix + "data", slot.request.data()))
                content.append((prefix + "seed", slot.seed.encode("ascii")))
            else:
                content.append((prefix + "data", b""))
                if slot.cancelled:
                    properties[prefix + CANCEL_PROPERTY] = "true"
            slot.started = True
        properties["batch_size"] = str(len(self.slots))
        properties.setdefault("handler", self.handler)
        return properties, content

    def apply(self, frame: wire.OutputFrame) -> list[tuple[FrontEndSlot, Record, dict[str, str]]]:
        """Match a step's reply to the slots by position; finished slots leave the list.

        Returns ``(slot, record, headers)`` per slot. Raises :class:`BatchFailure` (and arms
        ``reset_rollingbatch``) when the reply is not a 200 with one record per slot; the caller then
        fails every slot and calls :meth:`clear`.
        """
        try:
            records, per = step_records(frame, len(self.slots))
        except BatchFailure:
            self.reset = True
            raise
        results = [(slot, records[i], per[i]) for i, slot in enumerate(self.slots)]
        self.slots = [slot for slot, record, _ in results if not record.last]
        for slot, record, _ in results:
            slot.finished = record.last
        return results

    def clear(self) -> list[FrontEndSlot]:
        """Drop every slot (after a failure) and arm ``reset_rollingbatch``; returns the dropped."""
        dropped, self.slots = self.slots, []
        self.reset = True
        return dropped


class BufferSink:
    """A ``sendall`` target collecting bytes (an ``Output`` encoded in memory)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        """Collect ``data``."""
        self.parts.append(bytes(data))


class InProcessTransport:
    """Calls the handler in this process, through the same encode/decode path as the socket.

    Used by ``djl-handlers generate``; the entry point is loaded on the first call with the model
    directory on ``sys.path``, and ``device_id`` is added to every frame like the worker does.
    """

    def __init__(self, entry_point: str, model_dir: str, device_id: str = "-1") -> None:
        """Nothing is imported until the first :meth:`call`."""
        from djl_handlers.worker.loader import HandlerService

        self._service = HandlerService(entry_point, model_dir)
        self._device_id = device_id

    def call(self, properties: Mapping[str, str], content: Content) -> wire.OutputFrame:
        """Run the handler on one frame and decode its reply."""
        from djl_handlers.io.compat import input_from_frame

        raw = wire.encode_input_frame(properties, content)
        props, entries = wire.read_input_frame(io.BytesIO(raw))
        props["device_id"] = self._device_id
        output = self._service.invoke(input_from_frame(props, entries))
        buffer = BufferSink()
        output.send(buffer)
        finalize: Callable[[], Any] | None = getattr(output, "execute_finalize", None)
        if callable(finalize):
            finalize()
        return wire.read_output_frame(io.BytesIO(b"".join(buffer.parts)))
