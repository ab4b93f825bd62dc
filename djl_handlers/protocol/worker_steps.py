"""The rolling batch driven by the worker: the frames ``djl-handlers serve`` and its own worker
exchange instead of one step frame per step (no I/O here; :mod:`djl_handlers.worker.stepping` is the
worker's half, ``server.worker_channel`` carries the frames on the front end's event loop).

With DJL's protocol the front end sends every step and the worker answers it, so each token costs a
round trip through two processes, most of it wake-up latency (docs/benchmarks.md, "What the defaults rest on"). Here
the worker keeps the in-flight list itself (a :class:`.rolling.FrontEndBatch`, building exactly the
step frames DJL's ``RollingBatch.java`` would send, so any handler DJL can drive works) and steps
while the list is not empty; the front end only sends what changes:

* a **delta** frame (property ``djlh_delta``): new requests (``djlh_new``: their ids, in order; each
  with ``batch_NNN.``-prefixed properties and ``batch_NNN.data`` as in DJL's step frame), cancelled
  ids (``djlh_cancel``), ``djlh_pause`` (answer with a ``djlh_paused`` frame and stop stepping until a
  delta with new requests, cancellations or ``djlh_resume``: the front end pauses the worker before a
  control call such as adapter registration) and ``djlh_ack``, the number of step replies the front
  end has delivered so far: the worker runs at most :data:`WINDOW` steps ahead of it, so that a front
  end slower than the worker (many clients) gets fresh replies instead of a socket full of old ones;
* every **step reply** is DJL's step reply plus ``djlh_slots``: the ids of the requests it answers, in
  record order, so the front end matches records by id whatever deltas crossed the step on the wire.

Deltas that arrive while a step runs join at the next step, as they would have in DJL's next frame.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from djl_handlers.io import wire
from djl_handlers.protocol.messages import BatchFailure, Content, Frame, WorkerRequest, batch_prefix
from djl_handlers.protocol.rolling import FrontEndSlot, Record, step_records

__all__ = ["DELTA", "PAUSED", "SLOTS", "WINDOW", "Delta", "apply_reply", "delta_frame", "paused_frame", "read_delta"]

#: Step replies the worker may send beyond the last one the front end acknowledged (``djlh_ack``). At 64
#: clients on the fake engine the front end is the slower side; without a bound the worker filled the
#: socket with ~20 replies and a new request's first token waited behind them (TTFT p99 59 ms).
WINDOW = 3

DELTA = "djlh_delta"
NEW = "djlh_new"
CANCEL = "djlh_cancel"
PAUSE = "djlh_pause"
PAUSED = "djlh_paused"
RESUME = "djlh_resume"
ACK = "djlh_ack"
SLOTS = "djlh_slots"


@dataclass
class Delta:
    """What a delta frame asks of the worker."""

    handler: str
    new: list[tuple[str, WorkerRequest]] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)
    pause: bool = False
    resume: bool = False
    ack: int | None = None

    @property
    def resumes(self) -> bool:
        """Whether the worker steps again after it (a pause holds through acknowledgements only)."""
        return bool(self.new or self.cancel or self.resume)


def delta_frame(delta: Delta) -> Frame:
    """The frame for ``delta``."""
    properties: dict[str, str] = {DELTA: "1", "handler": delta.handler}
    content: Content = []
    if delta.new:
        properties[NEW] = ",".join(slot_id for slot_id, _ in delta.new)
    for index, (_, request) in enumerate(delta.new):
        prefix = batch_prefix(index)
        for key, value in request.properties.items():
            properties[prefix + key] = value
        content.append((prefix + "data", request.data()))
    if delta.cancel:
        properties[CANCEL] = ",".join(delta.cancel)
    if delta.pause:
        properties[PAUSE] = "1"
    if delta.resume:
        properties[RESUME] = "1"
    if delta.ack is not None:
        properties[ACK] = str(delta.ack)
    return properties, content


def read_delta(properties: Mapping[str, str], content: Content) -> Delta:
    """Inverse of :func:`delta_frame`; ``ValueError`` when a new request's body is missing."""
    ids = [x for x in properties.get(NEW, "").split(",") if x]
    bodies = dict(content)
    new: list[tuple[str, WorkerRequest]] = []
    for index, slot_id in enumerate(ids):
        prefix = batch_prefix(index)
        if prefix + "data" not in bodies:
            raise ValueError(f"delta frame: no body for new request {slot_id}")
        own = {key[len(prefix):]: value for key, value in properties.items() if key.startswith(prefix)}
        new.append((slot_id, WorkerRequest(own, [("data", bodies[prefix + "data"])])))
    cancel = [x for x in properties.get(CANCEL, "").split(",") if x]
    ack = properties.get(ACK)
    return Delta(properties.get("handler") or "handle", new, cancel, PAUSE in properties, RESUME in properties,
                 int(ack) if ack is not None else None)


def paused_frame() -> bytes:
    """The worker's answer to a pause: no step, nothing in flight until the next delta."""
    return wire.encode_output_frame(200, "OK", {PAUSED: "1"}, [])


def apply_reply(frame: wire.OutputFrame, view: dict[str, FrontEndSlot]
                ) -> list[tuple[FrontEndSlot, Record, dict[str, str]]]:
    """Match a step reply to ``view`` (id -> slot) by its ``djlh_slots``; finished slots leave
    ``view``. :class:`BatchFailure` (its ``slots`` the ones the step held, removed from ``view``)
    when the reply is not a 200 with one record per slot."""
    ids = [x for x in frame.properties.get(SLOTS, "").split(",") if x]
    unknown = [x for x in ids if x not in view]
    if unknown:
        raise ValueError(f"step reply names requests this front end does not hold: {unknown[:3]}")
    slots = [view[x] for x in ids]
    try:
        records, per = step_records(frame, len(ids))
    except BatchFailure as exc:
        for slot_id in ids:
            del view[slot_id]
        exc.slots = slots
        raise
    results = list(zip(slots, records, per, strict=True))
    for slot_id, (slot, record, _) in zip(ids, results, strict=True):
        if record.last:
            slot.finished = True
            del view[slot_id]
    return results
