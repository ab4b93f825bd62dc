"""The service in DJL's async mode: each request is awaited alone; the engine loop is ours.

DJL's ``PythonAsyncEngine`` (``option.async_mode=true``; the default of DJL 0.35+ for the vllm and
trtllm features) awaits ``handle(inputs)`` once per request, tagged with ``request_tracking_id``, and
expects ``None`` (init), an ``Output``, or an async generator of ``Output``s. Each reply ``Output``
carries one content item: the rolling-batch record ``{data, last[, code, error]}`` that DJL's Java
``Request.addResponse`` reads (HTTP body = the ``data`` of all records; a ``code`` before any data is
the status, the body then ``{"error", "code"}``), and its ``Content-Type`` as a property.

:class:`AsyncMode` turns one request into those replies with the same parser, slots and formatters as
the rolling batch, so greedy texts and bytes equal sync mode's. Engines that speak the step protocol
run under an :class:`~djl_handlers.scheduling.async_driver.AsyncDriver` (their own thread);
engines with a native asynchronous API (:class:`~djl_handlers.engines.base.AsyncEngine`: vLLM's
``AsyncLLM``, TensorRT-LLM's ``generate_async``) are awaited directly on the event loop.

Stateful sessions (LMI's ``requestType`` NEW_SESSION/CLOSE and the session header) are screened
before parsing by :class:`~djl_handlers.sessions.gate.SessionGate`; a request served in a session
carries its id to the engine.

Cancellation: a frame tagged ``cancel-...`` whose property ``djl_handlers_cancel`` names another
request's ``request_tracking_id`` finishes that request in the engine (our front end sends it when a
client goes away or a request times out); closing a request's reply generator does the same.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Optional

from djl_handlers.engines.base import AsyncEngine
from djl_handlers.errors import DjlHandlersError, message_of, status_of
from djl_handlers.extensions import (
    API_PROPERTY,
    CANCEL_PROPERTY,
    CANCEL_TRACKING_PREFIX,
    ENGINE_STATS_EVERY_STEPS,
    ENGINE_STATS_PROPERTY,
    REQUEST_ID_PROPERTY,
    TRACKING_ID_PROPERTY,
)
from djl_handlers.heap import in_djl_worker
from djl_handlers.io.compat import new_output
from djl_handlers.openmp import release_thread_pool
from djl_handlers.scheduling.async_driver import AsyncDriver, Subscription
from djl_handlers.scheduling.media import preload_images
from djl_handlers.scheduling.reply_guard import FIRST_REPLY_HOLD_S
from djl_handlers.scheduling.rolling import RollingBatch, error_slot
from djl_handlers.sessions.gate import SessionGate

if TYPE_CHECKING:
    from djl_handlers.service import InferenceService

__all__ = ["AsyncMode", "record_output"]

LOG = logging.getLogger(__name__)


def record_output(like: Any, record: dict[str, Any], content_type: str) -> Any:
    """One async-mode reply: ``record`` as the Output's only content item, ``Content-Type`` set."""
    out = new_output(like)
    out.add_property("Content-Type", content_type)
    out.add(type(out).binary_encode(record))
    return out


class AsyncMode:
    """One request per awaited call (see the module docstring); built by the service at init."""

    def __init__(self, service: InferenceService, batch: RollingBatch, max_running: int,
                 sessions: Optional[SessionGate] = None) -> None:
        self._service = service
        self._sessions = sessions
        self._batch = batch
        self._native = _native_async(batch.engine)
        self._driver: Optional[AsyncDriver] = None
        if self._native is None:
            self._driver = AsyncDriver(batch, max_running, after_step=self._after_step)
            # the steps run on the driver's thread: the loading thread's idle OpenMP threads would make
            # libgomp count more threads than CPUs and all but stop spinning (djl_handlers/openmp.py)
            LOG.info("OpenMP: the loading thread's thread pool released in %d libgomp(s) before the engine loop "
                     "takes the steps", release_thread_pool())
        self._live: dict[str, Subscription | _NativeRun] = {}
        self._steps = 0
        self._hold_s = FIRST_REPLY_HOLD_S if in_djl_worker() else 0.0

    @property
    def driver(self) -> Optional[AsyncDriver]:
        """The engine loop (None for engines with their own asynchronous API)."""
        return self._driver

    def in_flight(self) -> list[Any]:
        """The requests being served (their ``Request`` records)."""
        return [live.request for live in self._live.values()]

    async def handle(self, inputs: Any) -> Any:
        """DJL's async handler call for one request (the init call is answered by the service)."""
        if inputs.is_empty():
            return None
        begin = time.monotonic()
        tracking = str(inputs.get_property(TRACKING_ID_PROPERTY) or "")
        target = inputs.get_property(CANCEL_PROPERTY)
        if target and tracking.startswith(CANCEL_TRACKING_PREFIX):  # a client's header is no cancel frame
            self.cancel(str(target))
            return None
        session = None
        if self._sessions is not None:  # LMI's stateful sessions (sessions/gate.py)
            screened = self._sessions.screen(inputs)
            if screened.reply is not None:
                await self._hold_one_chunk_reply(begin)
                record, properties = screened.reply
                out = record_output(inputs, record, "application/json")
                for key, value in properties.items():
                    out.add_property(key, value)
                return out
            session = screened.session
        try:
            request = self._service.parse_one(inputs)
            await preload_images(self._batch.engine, request)  # off the loop: a remote fetch may wait
        except DjlHandlersError as exc:
            LOG.info("RequestId=[%s] rejected: %s", inputs.get_property(REQUEST_ID_PROPERTY) or "-", exc)
            from djl_handlers.dialects.registry import error_formatter

            slot = error_slot(exc, formatter=error_formatter(inputs.get_property(API_PROPERTY)))
            await self._hold_one_chunk_reply(begin)
            return record_output(inputs, slot.record(), slot.content_type)
        if session is not None:
            request.session = session
            for part in request.per_prompt:
                part.session = session
        if self._native is not None:
            run = _NativeRun(self._batch, self._native, request)
            return self._replies(inputs, tracking, run, run.records())
        assert self._driver is not None
        sub = self._driver.submit(request)
        return self._replies(inputs, tracking, sub, sub.records())

    async def _replies(self, like: Any, tracking: str, live: Subscription | _NativeRun,
                       records: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """The request's replies, one Output per record that carries data (and the last one)."""
        if tracking:
            self._live[tracking] = live
        try:
            async for record, content_type, extra in records:
                if extra:
                    record = dict(record)
                    record[ENGINE_STATS_PROPERTY] = json.dumps(extra, separators=(",", ":"))
                if record.get("last") and record.get("data") and "code" not in record:
                    # DJL's HTTP writer can miss a last chunk that arrives while it checks for more
                    # (its ChunkedBytesSupplier race: docs/djl-serving.md), losing a one-chunk
                    # answer or a stream's closing line: the data travels in a chunk of its own,
                    # the end in an empty one, which is all such a miss can lose
                    yield record_output(like, {"data": record["data"], "last": False}, content_type)
                    record = {**record, "data": ""}
                yield record_output(like, record, content_type)
        except Exception as exc:  # noqa: BLE001 - the engine failed this request: its last record
            LOG.exception("async request failed")
            yield record_output(like, {"data": "", "last": True, "code": status_of(exc), "error": message_of(exc)},
                                "application/json")
        finally:
            if tracking:
                self._live.pop(tracking, None)

    async def _hold_one_chunk_reply(self, begin: float) -> None:
        """A reply that is one last chunk (a refusal) waits, in DJL's worker, until the front end's HTTP
        writer waits for it: DJL reads a record's ``code`` only with ``last=true``, so such a reply cannot
        be split, and one that arrives while the writer first asks for more is lost (its
        ChunkedBytesSupplier race: scheduling/reply_guard.py, docs/djl-serving.md)."""
        if self._hold_s:
            await asyncio.sleep(max(0.0, begin + self._hold_s - time.monotonic()))

    def cancel(self, tracking_id: str) -> bool:
        """Cancel the request DJL tagged ``tracking_id``; False when it is not (or no longer) here."""
        live = self._live.get(tracking_id)
        if live is None:
            return False
        live.cancel()
        return True

    def _after_step(self, running: int) -> Optional[dict[str, Any]]:
        """On the engine thread after each step: retire unused adapters; engine figures every
        ``ENGINE_STATS_EVERY_STEPS`` steps and when the batch has just emptied."""
        service = self._service
        if service.lora is not None:
            service.lora.retire_unused()
        self._steps += 1
        if running and (self._steps - 1) % ENGINE_STATS_EVERY_STEPS:
            return None
        return service.engine_stats(running)

    def close(self) -> None:
        """Stop the engine loop thread."""
        if self._driver is not None:
            self._driver.close()


class _NativeRun:
    """One request on an engine with its own asynchronous API: the slot turns its token events into
    records exactly as in the rolling batch."""

    def __init__(self, batch: RollingBatch, engine: Any, request: Any) -> None:
        self.request = request
        self._engine = engine
        self.slot, self._engine_requests = batch.prepare(request)

    async def records(self) -> AsyncIterator[Any]:
        slot = self.slot
        if not self._engine_requests:  # the slot failed before the engine saw it
            yield slot.record(), slot.content_type, None
            return
        exhausted = False
        try:
            try:
                async for outputs in _merged(self._engine, self._engine_requests):
                    for step in outputs:
                        slot.consume(step)
                    record = slot.record()
                    if record.get("data") or record.get("last"):
                        yield record, slot.content_type, None
                    if slot.finished:  # a stop rule, max_new_tokens or a cancel ended it here
                        return
            except Exception as exc:  # noqa: BLE001 - this request's failure (its status: 400 for bad input)
                slot.fail(message_of(exc), status_of(exc))  # rendered in its dialect, as in the rolling batch
                yield slot.record(), slot.content_type, None
                return
            exhausted = True
            if not slot.finished:  # the engine's stream ended without a finish of ours
                slot.finish("length")
                yield slot.record(), slot.content_type, None
        finally:
            if not exhausted:
                for engine_request in self._engine_requests:
                    await _abort_quietly(self._engine, engine_request.request_id)

    def cancel(self) -> None:
        """Finish now: the next record is the last (empty), then the engine aborts the request."""
        self.slot.cancel()


async def _merged(engine: Any, requests: list[Any]) -> AsyncIterator[list[Any]]:
    """The outputs of ``engine.generate_async`` for every request (one per prompt of a request with
    several), as they come; the first failure ends them all."""
    if len(requests) == 1:
        async for outputs in engine.generate_async(requests[0]):
            yield outputs
        return
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump(request: Any) -> None:
        try:
            async for outputs in engine.generate_async(request):
                await queue.put(outputs)
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            await queue.put(exc)
        finally:
            await queue.put(None)

    tasks = [asyncio.ensure_future(pump(request)) for request in requests]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


async def _abort_quietly(engine: Any, request_id: int) -> None:
    try:
        await engine.abort_async(request_id)
    except Exception:  # noqa: BLE001 - aborting a finished request must never fail a reply
        LOG.debug("abort_async(%s) failed", request_id, exc_info=True)


def _native_async(engine: Any) -> Optional[AsyncEngine]:
    """The engine itself when it has an asynchronous API (:class:`AsyncEngine`: ``generate_async``
    and ``abort_async``), else None."""
    return engine if isinstance(engine, AsyncEngine) else None
