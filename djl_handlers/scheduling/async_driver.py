"""The engine loop of async mode: a rolling batch that steps on its own thread.

In DJL's async mode the front end sends each request alone and awaits the handler; nobody calls a
rolling-batch step. :class:`AsyncDriver` therefore owns the step loop for engines that speak the
step protocol (HF, DeepSpeed, the fake engine): callers on an asyncio loop :meth:`~AsyncDriver.submit`
a parsed request and read its records (the same ``{data, last[, code, error]}`` records a
rolling-batch step returns) from a :class:`Subscription`; the loop thread admits new requests between
steps (at most ``max_running`` at once, the rest wait in order), runs one step while any request is
running, and hands each step's records to their subscribers with one loop wake-up per step.

A subscription that is closed before its last record (the client went away, a timeout) cancels its
request in the engine at the next step boundary.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from djl_handlers.request.records import Request
from djl_handlers.scheduling.rolling import RollingBatch
from djl_handlers.scheduling.slot import RequestSlot

__all__ = ["AsyncDriver", "Subscription"]

LOG = logging.getLogger(__name__)

# (rolling-batch record, content type, extra output properties or None)
Record = tuple[dict[str, Any], str, Optional[dict[str, str]]]
_END = object()


@dataclass(eq=False)
class Subscription:
    """One submitted request: its records arrive on ``queue`` (on the submitter's event loop)."""

    request: Request
    loop: asyncio.AbstractEventLoop
    driver: AsyncDriver
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    slot: Optional[RequestSlot] = None
    done: bool = False
    cancelled: bool = False

    async def records(self) -> AsyncIterator[Record]:
        """The request's records, the last one included; closing early cancels the request."""
        try:
            while True:
                item = await self.queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item[0].get("last"):
                    self.done = True
                    return
        finally:
            if not self.done:
                self.cancel()

    def cancel(self) -> None:
        """Finish the request in the engine at the next step boundary (no further records)."""
        if not self.done and not self.cancelled:
            self.cancelled = True
            self.driver.cancel(self)


class AsyncDriver:
    """Steps ``batch`` on a daemon thread while requests are running (see the module docstring).

    ``after_step(running)`` runs on the loop thread after every step (adapter retirement, engine
    figures); what it returns, when not None, rides as the extra properties of that step's first
    delivered record.
    """

    def __init__(self, batch: RollingBatch, max_running: int,
                 after_step: Optional[Callable[[int], Optional[dict[str, str]]]] = None,
                 name: str = "djl-handlers-engine-loop") -> None:
        self._batch = batch
        self._max_running = max(1, max_running)
        self._after_step = after_step
        self._name = name
        self._cond = threading.Condition()
        self._waiting: deque[Subscription] = deque()
        self._cancels: list[Subscription] = []
        self._by_slot: dict[int, Subscription] = {}
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self.steps = 0

    # -- callers (any thread) -------------------------------------------------------------------
    def submit(self, request: Request, loop: Optional[asyncio.AbstractEventLoop] = None) -> Subscription:
        """Queue ``request``; its records go to the returned subscription on ``loop`` (default: running)."""
        loop = loop or asyncio.get_running_loop()
        sub = Subscription(request=request, loop=loop, driver=self)
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine loop is closed")
            self._waiting.append(sub)
            self._ensure_thread()
            self._cond.notify()
        return sub

    def cancel(self, sub: Subscription) -> None:
        """Cancel ``sub``'s request (thread-safe; a no-op once it finished)."""
        with self._cond:
            self._cancels.append(sub)
            self._cond.notify()

    @property
    def waiting(self) -> int:
        """Requests submitted but not yet admitted into the batch."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Requests in the batch."""
        return len(self._batch)

    def close(self) -> None:
        """Stop the loop thread after its current step; requests still held get no more records."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)

    # -- the loop thread ----------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._batch.slots and not self._waiting and not self._cancels:
                    self._cond.wait()
                if self._closed:
                    return
                cancels, self._cancels = self._cancels, []
                admitted = self._take_waiting(cancels)
            self._apply_cancels(cancels)
            for sub in admitted:
                self._admit(sub)
            if self._batch.slots:
                self._step()

    def _take_waiting(self, cancels: list[Subscription]) -> list[Subscription]:
        """Waiting requests that fit the batch (cancelled ones are dropped with a last record)."""
        dropped = {id(s) for s in cancels if s.slot is None}
        taken: list[Subscription] = []
        room = self._max_running - len(self._batch.slots)
        kept: deque[Subscription] = deque()
        while self._waiting:
            sub = self._waiting.popleft()
            if id(sub) in dropped:  # cancelled before it ran: its last record, empty
                _deliver_threadsafe([(sub, ({"data": "", "last": True}, "application/json", None))])
            elif room > 0:
                taken.append(sub)
                room -= 1
            else:
                kept.append(sub)
        self._waiting = kept
        return taken

    def _admit(self, sub: Subscription) -> None:
        try:
            slot = self._batch.add_request(sub.request)
        except Exception as exc:  # noqa: BLE001 - add_request reports failures as error slots
            LOG.exception("admitting a request failed")
            _deliver_threadsafe([(sub, exc)])
            return
        sub.slot = slot
        self._by_slot[id(slot)] = sub

    def _apply_cancels(self, cancels: list[Subscription]) -> None:
        for sub in cancels:
            slot = sub.slot
            if slot is not None and not slot.finished:
                slot.cancel()

    def _step(self) -> None:
        slots = list(self._batch.slots)
        try:
            results = self._batch.step()
        except Exception as exc:  # noqa: BLE001 - RollingBatch isolates failures; this is a bug guard
            LOG.exception("rolling step failed; failing its %d requests", len(slots))
            self._batch.reset()
            _deliver_threadsafe([(s, exc) for s in (self._by_slot.pop(id(x), None) for x in slots) if s])
            return
        self.steps += 1
        extra = self._after_step(len(self._batch)) if self._after_step is not None else None
        items: list[tuple[Subscription, Any]] = []
        for slot, (record, content_type) in zip(slots, results, strict=True):
            sub = self._by_slot.get(id(slot))
            if sub is None:
                continue
            if record.get("last"):
                del self._by_slot[id(slot)]
            elif not record.get("data"):
                continue  # nothing for the client this step (a non-streaming body is built at the end)
            items.append((sub, (record, content_type, extra)))
            extra = None
        if items:
            _deliver_threadsafe(items)
            # Let the event loop take the GIL now and send this step's replies: a step that holds
            # the GIL (a fast engine, pure Python) would otherwise keep it for the whole switch
            # interval (5 ms), delaying every reply by several steps.
            time.sleep(0)


def _deliver_threadsafe(items: list[tuple[Subscription, Any]]) -> None:
    """Put each item on its subscription's queue: one wake-up per event loop."""
    by_loop: dict[int, tuple[asyncio.AbstractEventLoop, list[tuple[Subscription, Any]]]] = {}
    for sub, item in items:
        by_loop.setdefault(id(sub.loop), (sub.loop, []))[1].append((sub, item))
    for loop, group in by_loop.values():
        try:
            loop.call_soon_threadsafe(_deliver, group)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            LOG.debug("event loop closed; %d records dropped", len(group))


def _deliver(group: list[tuple[Subscription, Any]]) -> None:
    for sub, item in group:
        sub.queue.put_nowait(item)
