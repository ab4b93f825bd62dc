"""The front end's half of a rolling batch (``RollingBatch.java``), driven one step at a time.

:class:`FrontEndBatch` holds the in-flight list and builds each step's frame: the whole list every
step, properties/body/seed only on a request's first step and empty bodies afterwards,
``reset_rollingbatch=true`` after a failure, positional identity. The reply carries one record per
request (:class:`Record`, ``Output.binary_encode``: ``data``/``last``/``code``/``error``) and
``batch_{i}_<name>`` properties that become that request's headers. The handler's half is
``scheduling.rolling.RollingBatch``; ``testing.java_loop.RollingBatchDriver`` emulates this half in
process for tests.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from djl_handlers.errors import record_error_body
from djl_handlers.extensions import CANCEL_PROPERTY, STATS_RECORD_KEY
from djl_handlers.io import wire
from djl_handlers.protocol.messages import BatchFailure, Content, Frame, WorkerRequest, batch_prefix, split_properties

__all__ = ["FrontEndBatch", "FrontEndSlot", "Record", "decode_record", "step_records"]


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
    slot_id: str = ""  # its id in a worker-driven batch (protocol.worker_steps)


def step_records(frame: wire.OutputFrame, size: int) -> tuple[list[Record], list[dict[str, str]]]:
    """A rolling step's reply for ``size`` requests: one record and one header dict per request, by
    position; :class:`BatchFailure` when the reply is not a 200 with one decodable record each."""
    content = frame.content
    if frame.code != 200 or content is None or len(content) != size:
        if frame.code != 200:
            raise BatchFailure(frame.code, f"Batch inference failed: {frame.message}")
        actual = "a stream" if content is None else len(content)
        raise BatchFailure(500, f"Batch output size mismatch, expected: {size}, actual: {actual}")
    _, per = split_properties(frame.properties, size)
    try:
        records = [decode_record(blob) for _, blob in content]
    except (ValueError, KeyError) as exc:
        raise BatchFailure(500, f"Batch inference failed: undecodable record: {exc}") from exc
    return records, per


class FrontEndBatch:
    """``RollingBatch.java``'s list and frame building, driven by the caller one step at a time."""

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
            prefix = batch_prefix(index)
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
