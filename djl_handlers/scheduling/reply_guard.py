"""Rolling-batch records shaped so that DJL's HTTP writer cannot miss a reply's last chunk.

DJL's front end writes a rolling-batch reply by looping ``while (supplier.hasNext())`` over the
request's ``ChunkedBytesSupplier``, and ``appendContent(bytes, last=true)`` marks that buffer complete
before it queues the bytes (docs/djl-serving.md, "A reply DJL's front end can lose"). A last chunk
that arrives while the writer asks ``hasNext()`` is lost:

* a reply that is **one last chunk** (a refusal, or an answer finished in the request's first step)
  loses its header too, and the client waits until its own timeout. The writer asks ``hasNext()``
  first just after the request is queued, which is when such a record arrives. The guard holds the
  record back until :data:`FIRST_REPLY_HOLD_S` after the request reached the worker (empty, not-last
  records meanwhile, which DJL's front end does not forward): by then the writer waits inside
  ``nextChunk`` and takes the chunk whole. A refusal cannot travel otherwise, because DJL reads a
  record's ``code`` only with ``last=true``.
* a **stream's closing line** (a last record with data after earlier data) arrives while the writer
  checks for more after the previous chunk: it is sent as the data with ``last=false`` and, on the
  next step, an empty last record, so a miss can only lose the empty chunk.

Only DJL's front end needs this (``djl-handlers serve`` reads every record); the service turns it on
when the step frames come as ``djl_python`` objects.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from djl_handlers.extensions import STEP_TOKENS_KEY

__all__ = ["FIRST_REPLY_HOLD_S", "ReplyGuard"]

#: How long after a request reached the worker its first record may be its last one. The writer
#: starts as the request is queued, well under a millisecond before the worker even sees it; 10 ms
#: leaves room for a loaded machine's scheduling delays and is shorter than any model's first step
#: on a CPU, so only refusals and tiny answers ever wait (a 50 ms hold made a corpus of refusals
#: through DJL 1.6x slower to answer; this one costs little).
FIRST_REPLY_HOLD_S = 0.01

_WAITING: dict[str, Any] = {"data": "", "last": False, STEP_TOKENS_KEY: 0}


class ReplyGuard:
    """Per-slot records held back or split (see the module's text); keyed by the slot's id."""

    def __init__(self, hold_s: float = FIRST_REPLY_HOLD_S) -> None:
        self.hold_s = hold_s
        self._arrived: dict[int, float] = {}
        self._sent: set[int] = set()  # slots whose earlier records carried data
        self._pending: dict[int, dict[str, Any]] = {}

    def arrived(self, slot_id: int, now: Optional[float] = None) -> None:
        """Note that the request of ``slot_id`` reached the worker."""
        self._arrived.setdefault(slot_id, time.monotonic() if now is None else now)

    def holds(self, slot_id: int) -> bool:
        """True while the slot has a record still to send (it stays in the batch until then)."""
        return slot_id in self._pending

    def shape(self, slot_id: int, record: dict[str, Any], now: Optional[float] = None) -> dict[str, Any]:
        """The record to send this step for ``slot_id``, given the one the slot produced (``{}``
        when the slot has nothing new because its last record is pending)."""
        now = time.monotonic() if now is None else now
        pending = self._pending.get(slot_id)
        if pending is not None:
            if self._early(slot_id, now) and slot_id not in self._sent:
                return dict(_WAITING)
            return self._finish(slot_id, pending)
        if not record.get("last"):
            if record.get("data"):
                self._sent.add(slot_id)
            return record
        if slot_id not in self._sent:  # the whole reply is this one chunk
            if self._early(slot_id, now):
                self._pending[slot_id] = record
                return dict(_WAITING)
            return self._finish(slot_id, record)
        if record.get("data") and "code" not in record:
            self._pending[slot_id] = {**record, "data": "", STEP_TOKENS_KEY: 0}
            return {"data": record["data"], "last": False, STEP_TOKENS_KEY: record.get(STEP_TOKENS_KEY, 0)}
        return self._finish(slot_id, record)

    def wait_s(self, now: Optional[float] = None) -> float:
        """Seconds until the earliest held first reply may go (0 when none is held)."""
        now = time.monotonic() if now is None else now
        waits = [self._arrived[s] + self.hold_s - now for s in self._pending
                 if s not in self._sent and s in self._arrived]
        return max(0.0, min(waits)) if waits else 0.0

    def forget(self, slot_id: int) -> None:
        """Drop what is kept for a slot that left the batch without its last record (a reset)."""
        self._arrived.pop(slot_id, None)
        self._sent.discard(slot_id)
        self._pending.pop(slot_id, None)

    def clear(self) -> None:
        self._arrived.clear()
        self._sent.clear()
        self._pending.clear()

    def _early(self, slot_id: int, now: float) -> bool:
        arrived = self._arrived.get(slot_id)
        return arrived is not None and now - arrived < self.hold_s

    def _finish(self, slot_id: int, record: dict[str, Any]) -> dict[str, Any]:
        self.forget(slot_id)
        return record
