"""The model runtime: one worker process, a bounded queue, and DJL's batching loops.

Exactly one frame is on the worker's socket at a time; all state lives on the event loop. Two
drivers:

* dynamic batching: gather up to ``batch_size`` requests for up to ``max_batch_delay`` ms, send one
  frame (``protocol.dynamic.batch_frame``), split the reply; a streamed reply is relayed chunk by chunk.
  The exchange runs on one dedicated thread (``run_in_executor`` on a single-thread pool);
* rolling batch, driven by the worker (``protocol.worker_steps``): the worker keeps the in-flight list and
  steps while it holds requests; the front end sends it deltas (new requests, at most
  ``max_rolling_batch_size`` in flight, the rest wait in the queue; cancellations) over a channel on
  the event loop (:mod:`.worker_channel`) and delivers each step's records as they arrive. Control
  calls (adapters) and restarts stay on the thread: the worker is paused between steps and the
  channel closed while they run; an asyncio lock keeps them apart;
* rolling batch with a worker that is not ours (``DJL_HANDLERS_WORKER_SCRIPT``, e.g. DJL's own
  ``djl_python_engine.py``): DJL's protocol, ``protocol.rolling.FrontEndBatch`` building every step's
  frame, the exchange on the event loop (:mod:`.loop_exchange`), step n+1 sent before step n's
  records are delivered (docs/benchmarks.md, "What the defaults rest on").

In async mode (``option.async_mode=true``) the worker runs its own engine loop: each request is sent
alone as soon as it is taken and answered as it progresses (:mod:`.async_loop`, DJL's
``AsyncRequestManager``), on a channel like the worker-driven batch's.

A worker that dies fails only the requests it held (error chunk or 500 JSON) and is restarted with
the init call. :meth:`ModelRuntime.drain` implements graceful shutdown.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from djl_handlers.extensions import STATS_RECORD_KEY
from djl_handlers.io import wire
from djl_handlers.protocol.dynamic import batch_frame, looks_like_record, split_batch
from djl_handlers.protocol.messages import BatchFailure, Reply, WorkerRequest
from djl_handlers.protocol.rolling import FrontEndBatch, FrontEndSlot, Record
from djl_handlers.protocol.worker_steps import PAUSED, Delta, apply_reply, delta_frame
from djl_handlers.server.adapters import FrontAdapters, startup_adapters
from djl_handlers.server.async_loop import AsyncRequests
from djl_handlers.server.loop_exchange import start_call
from djl_handlers.server.settings import ServerSettings
from djl_handlers.server.sink import ResponseSink, error_json
from djl_handlers.server.telemetry import Telemetry
from djl_handlers.server.worker_channel import StepChannel
from djl_handlers.server.worker_process import StartupError, WorkerDied, WorkerProcess, WorkerSpec

__all__ = ["ModelRuntime", "QueueFull", "ShuttingDown"]

_LOG = logging.getLogger("djl_handlers.server")
_WATCH_INTERVAL_S = 0.5


class QueueFull(Exception):
    """``job_queue_size`` requests are already waiting (HTTP 503)."""


class ShuttingDown(Exception):
    """The server no longer accepts requests (HTTP 503)."""


def _rolling_error(code: int, message: str) -> bytes:
    return Record(code=code, error=message).error_body()


class ModelRuntime:
    """Owns the worker and schedules requests onto it."""

    def __init__(self, settings: ServerSettings, worker: WorkerProcess | None = None,
                 log_prompts: bool = False) -> None:
        """Build the runtime; :meth:`start_worker` then :meth:`attach` make it serve."""
        self.settings = settings
        self.worker = worker or WorkerProcess(WorkerSpec(
            model_dir=settings.model_dir, entry_point=settings.entry_point,
            init_properties=settings.init_properties(), predict_timeout_s=settings.predict_timeout_s,
            loading_timeout_s=settings.loading_timeout_s, env=settings.worker_env, async_mode=settings.async_mode,
        ))
        self.telemetry = Telemetry(
            settings.model_name, running=lambda: self.in_flight, waiting=self.queue_depth,
            worker_up=lambda: int(self.alive()), log_prompts=log_prompts,
            max_model_len=settings.options.get("max_model_len"),
        )
        self.metrics = self.telemetry.metrics
        self.adapters = FrontAdapters(settings.options.get("enable_lora", "").strip().lower() in ("true", "1"))
        self.accepting = True
        self.in_flight = 0
        self.outstanding: set[ResponseSink] = set()
        self._queue: deque[tuple[WorkerRequest, ResponseSink]] = deque()
        self._batcher = FrontEndBatch(settings.handler, settings.max_rolling_batch_size)  # DJL's protocol
        self._view: dict[str, FrontEndSlot] = {}  # rolling: requests the worker holds, by slot id
        self._slot_ids = itertools.count(1)
        self._cancels: set[str] = set()  # ids of held requests cancelled since the last delta
        self._paused = False  # the worker answered a pause and runs no step until the next delta
        self._last_was_pause = False
        self._pauses_unanswered = 0
        self._replies_seen = 0  # step replies taken from this worker (the worker steps <= WINDOW ahead)
        self._ack_sent = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="djlh-worker-io")
        self._wake: asyncio.Event | None = None
        self._io_lock = asyncio.Lock()  # one worker exchange at a time: a rolling step or a control call
        self._controls = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async = AsyncRequests(self)  # async mode: the requests the worker holds, by tracking id
        self._async_cancels: set[str] = set()
        self._async_controls: deque[tuple[dict[str, str], list[tuple[str | None, bytes]],
                                          asyncio.Future[Any]]] = deque()

    # ------------------------------------------------------------------ lifecycle

    def start_worker(self) -> None:
        """Start the worker and run the init call (blocking; before the port opens); with LoRA
        enabled, register the adapters of the model directory's ``adapters/`` folder."""
        self.worker.start()
        if self.adapters.enabled and not self.adapters.items:
            for adapter in startup_adapters(self.settings.model_dir):
                self._register_on_worker(adapter)
                self.adapters.items[adapter.name] = adapter

    def _start_and_replay(self) -> None:
        """Worker thread: restart the worker and register the known adapters again (as DJL does)."""
        self.worker.start()
        for adapter in list(self.adapters.items.values()):
            self._register_on_worker(adapter)

    def _register_on_worker(self, adapter: Any) -> None:
        frame = self.worker.call(*adapter.frame("register_adapter"))
        if self.settings.async_mode:
            frame = _record_frame(frame)
        if frame.code >= 300:
            raise StartupError(f"Failed to register adapter {adapter.name}: {frame.message}")

    async def control(self, properties: dict[str, str], content: list[tuple[str | None, bytes]]) -> wire.OutputFrame:
        """One non-inference call (adapter management) on the worker thread, between batch steps."""
        loop = asyncio.get_running_loop()
        if self.settings.async_mode:  # as DJL: through the async channel, answered by a record
            future: asyncio.Future[Any] = loop.create_future()
            self._async_controls.append((properties, content, future))
            self._poke()
            reply = await asyncio.wait_for(future, self.settings.predict_timeout_s)
            return _record_frame(reply)
        self._controls += 1  # the rolling loop pauses the worker and closes its channel for it
        self._poke()
        try:
            async with self._io_lock:
                frame: wire.OutputFrame = await loop.run_in_executor(
                    self._executor, self._call_drained, properties, content)
        finally:
            self._controls -= 1
            self._poke()
        return frame

    def attach(self) -> None:
        """Start the scheduling loop and the worker watchdog on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self.settings.async_mode:
            loop_fn = self._async_loop
        elif not self.settings.rolling:
            loop_fn = self._dynamic_loop
        else:
            loop_fn = self._delta_loop if self.worker.drives_steps() else self._step_loop
        self._tasks = [asyncio.create_task(loop_fn()), asyncio.create_task(self._watchdog())]

    async def close(self) -> None:
        """Stop the loops and the worker."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.worker.stop)
        self._executor.shutdown(wait=False)
        self.telemetry.close()

    def alive(self) -> bool:
        """True when the worker is up and initialized."""
        return self.worker.alive()

    def queue_depth(self) -> int:
        """Requests waiting for the worker."""
        return len(self._queue)

    async def drain(self, grace_s: float) -> None:
        """Refuse new requests, wait up to ``grace_s`` for the outstanding ones, fail the rest (503)."""
        self.accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self.outstanding and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for sink in list(self.outstanding):
            sink.fail(503, _rolling_error(503, "the server shut down before the request finished")
                      if self.settings.rolling or self.settings.async_mode else
                      error_json(503, "ServiceUnavailableException", "the server is shutting down"))
        self._queue.clear()

    # ------------------------------------------------------------------ admission

    def submit(self, request: WorkerRequest) -> ResponseSink:
        """Queue a request; :class:`ShuttingDown` or :class:`QueueFull` when it cannot be taken."""
        if not self.accepting:
            raise ShuttingDown("the server is shutting down")
        if len(self._queue) >= self.settings.job_queue_size:
            raise QueueFull(f"the job queue is full ({self.settings.job_queue_size} requests waiting)")
        sink = ResponseSink(on_done=self._done, on_cancel=self._cancelled)
        sink.trace = self.telemetry.start(request.properties, request.content)
        self.outstanding.add(sink)
        self._queue.append((request, sink))
        self._poke()
        return sink

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _done(self, sink: ResponseSink) -> None:
        self.outstanding.discard(sink)
        sink.slot = None  # the slot (still held until the worker's last record) keeps its owner, not vice versa
        self.telemetry.finish(sink.trace, sink.status or 499, sink.cancelled)

    def _cancelled(self, sink: ResponseSink) -> None:
        self.metrics.cancelled.inc()
        tracking = getattr(sink, "tracking_id", None)
        if tracking is not None:
            self._async_cancels.add(tracking)
        elif sink.slot is not None:
            sink.slot.cancelled = True
            if sink.slot.slot_id in self._view:
                self._cancels.add(sink.slot.slot_id)
        self._poke()

    async def _wait_for_work(self, busy: bool = False) -> None:
        assert self._wake is not None
        while not (self._queue or busy or not self.worker.alive()):
            self._wake.clear()
            await self._wake.wait()

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_INTERVAL_S)
            if not self.worker.alive():
                self._poke()

    async def _restart(self) -> None:
        """Restart a dead worker (with its init call); on failure fail the waiting requests."""
        self.metrics.restarts.inc()
        _LOG.warning("worker process is not running; restarting it")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._start_and_replay)
        except StartupError as exc:
            _LOG.error("worker restart failed: %s", exc)
            while self._queue:
                _, sink = self._queue.popleft()
                sink.fail(503, error_json(503, "ServiceUnavailableException", f"worker unavailable: {exc}"))
            await asyncio.sleep(1.0)

    # ------------------------------------------------------------------ dynamic batching

    async def _dynamic_loop(self) -> None:
        while True:
            await self._wait_for_work()
            if not self.worker.alive():
                await self._restart()
                continue
            await self._batch_once()

    async def _batch_once(self) -> None:
        """Gather one batch and run it (its own frame: an idle loop holds no finished request)."""
        batch = [(request, sink) for request, sink in await self._gather() if not sink.done]
        if batch:
            await self._run_batch(batch)

    async def _gather(self) -> list[tuple[WorkerRequest, ResponseSink]]:
        """Up to ``batch_size`` requests, waiting at most ``max_batch_delay`` for more."""
        assert self._wake is not None
        batch = [self._queue.popleft()] if self._queue else []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.max_batch_delay_ms / 1000.0
        while batch and len(batch) < self.settings.batch_size:
            if self._queue:
                batch.append(self._queue.popleft())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except TimeoutError:
                break
        return batch

    async def _run_batch(self, batch: list[tuple[WorkerRequest, ResponseSink]]) -> None:
        sinks = [sink for _, sink in batch]
        properties, content = batch_frame([request for request, _ in batch], self.settings.handler)
        loop = asyncio.get_running_loop()
        self.in_flight = len(batch)
        for sink in sinks:
            self.telemetry.admitted(sink.trace)
        try:
            replies = await loop.run_in_executor(self._executor, self._exchange, properties, content, sinks)
        except WorkerDied as exc:
            for sink in sinks:
                sink.fail(500, error_json(500, "WorkerDiedException", str(exc)))
            return
        except BatchFailure as exc:
            for sink in sinks:
                sink.fail(exc.code, error_json(exc.code, "BatchFailure", exc.message))
            return
        finally:
            self.in_flight = 0
        for sink, reply in zip(sinks, replies or [], strict=False):
            if looks_like_record(reply):
                sink.fail(500, error_json(500, "ConfigurationMismatch", (
                    "the handler answered with rolling-batch records while the server runs dynamic "
                    f"batching ({self.settings.resolved.why() if self.settings.resolved else 'dynamic'}); "
                    "set option.rolling_batch explicitly in serving.properties")))
                continue
            stats = reply.headers.pop(STATS_RECORD_KEY, None)  # a pooling model's request stats (metrics)
            if stats is not None and sink.trace is not None:
                sink.trace.stats = stats
            sink.respond(reply.code, reply.headers, reply.body)

    def _exchange(self, properties: dict[str, str], content: list[tuple[str | None, bytes]],
                  sinks: list[ResponseSink]) -> list[Reply] | None:
        """Worker thread: one call; a streamed reply is relayed to the (single) sink here."""
        frame = self.worker.call(properties, content)
        if frame.chunks is not None and len(sinks) == 1:
            self._relay(frame, sinks[0])
            return None
        return split_batch(frame, len(sinks))

    def _relay(self, frame: wire.OutputFrame, sink: ResponseSink) -> None:
        assert self._loop is not None and frame.chunks is not None
        call = self._loop.call_soon_threadsafe
        call(sink.start, frame.code, dict(frame.properties))
        for data, _more in frame.chunks:
            if data:
                call(self.telemetry.chunk, sink.trace)
                call(sink.write, data)
        call(sink.finish)

    # ------------------------------------------------------------------ rolling batch

    async def _delta_loop(self) -> None:
        """The worker-driven rolling batch (``protocol.worker_steps``): the worker steps on its own while
        it holds requests; this loop sends it deltas (new requests, cancellations, a pause before a
        control call) and delivers each step's records as its reply arrives. It holds the I/O lock
        while the channel is open."""
        assert self._wake is not None
        channel: StepChannel | None = None
        try:
            while True:
                self._wake.clear()
                if channel is not None:
                    self._take_replies(channel)
                    if channel.failure is not None:
                        self._lost(channel, channel.failure)
                        channel = None
                if channel is not None and self._paused and self._controls:
                    channel.close()  # the worker waits between steps: the control call may use the socket
                    channel = None
                    self._io_lock.release()
                if channel is None:
                    if not self.worker.alive():
                        self._drop_all("the worker process died")  # e.g. during a control call
                        await self._restart()
                        continue
                    if not self._controls and (self._view or self._admissible()):
                        await self._io_lock.acquire()
                        assert self._loop is not None
                        channel = StepChannel(self._loop, self.worker, self._poke)
                        continue
                    await self._wake.wait()
                    continue
                self._send_delta(channel)
                channel.expect(bool(self._view) or self._pauses_unanswered > 0)
                self.in_flight = len(self._view)
                await self._wake.wait()
        finally:
            if channel is not None:
                channel.close()

    def _admissible(self) -> bool:
        return bool(self._queue) and len(self._view) < self.settings.max_rolling_batch_size

    def _send_delta(self, channel: StepChannel) -> None:
        """Admit waiting requests while there is room and pass on cancellations (or resume a paused
        worker); while a control call waits, only pause the worker. Nothing when nothing changed."""
        handler = self.settings.handler
        if self._controls:  # nothing else until the control call has run: the worker must stay paused
            if not self._paused and not self._last_was_pause:
                self._send(channel, Delta(handler, pause=True))
            return
        new: list[tuple[str, WorkerRequest]] = []
        while len(self._view) < self.settings.max_rolling_batch_size:
            slot = self._next_admitted()
            if slot is None:
                break
            slot.slot_id = slot_id = str(next(self._slot_ids))
            self._view[slot_id] = slot
            new.append((slot_id, slot.request))
        cancel = [slot_id for slot_id in self._cancels if slot_id in self._view]
        self._cancels.clear()
        resume = self._paused and bool(self._view)
        ack = self._replies_seen if self._replies_seen != self._ack_sent else None
        if new or cancel or resume or ack is not None:
            self._send(channel, Delta(handler, new, cancel, resume=resume, ack=ack))

    def _send(self, channel: StepChannel, delta: Delta) -> None:
        channel.send(delta_frame(delta))
        if delta.ack is not None:
            self._ack_sent = delta.ack
        self._last_was_pause = delta.pause
        self._pauses_unanswered += delta.pause
        if delta.resumes:
            self._paused = False  # a pause holds from its answer to the next resuming delta

    def _take_replies(self, channel: StepChannel) -> None:
        """Deliver every reply the channel has parsed."""
        frames = channel.frames
        while frames:
            frame = frames.popleft()
            if PAUSED in frame.properties:  # paused if this answers the last delta sent
                self._pauses_unanswered -= 1
                self._paused = self._pauses_unanswered == 0 and self._last_was_pause
                continue
            self._replies_seen += 1  # acknowledged with the next delta (the worker's window)
            try:
                results = apply_reply(frame, self._view)
            except BatchFailure as exc:
                self._fail_slots(exc.slots, exc.code, exc.message)
                continue
            except ValueError as exc:
                channel.fail(f"the worker broke the step protocol: {exc}")
                return
            self.telemetry.rolling_step(results, frame.properties, len(results))
            for slot, record, headers in results:
                self._deliver(slot, record, headers)
        self.in_flight = len(self._view)

    def _lost(self, channel: StepChannel, why: str) -> None:
        """The worker died or stopped answering: fail every request it held; release the I/O lock."""
        channel.close()
        self._drop_all(why)
        self._io_lock.release()

    def _drop_all(self, why: str) -> None:
        """Fail every request the (dead) worker held and forget its state."""
        self._fail_slots(list(self._view.values()), 500, why)
        self._view.clear()
        self._cancels.clear()
        self._paused = self._last_was_pause = False
        self._pauses_unanswered = self._replies_seen = self._ack_sent = 0
        self.in_flight = 0

    async def _step_loop(self) -> None:
        """DJL's protocol, for a worker that is not ours (``DJL_HANDLERS_WORKER_SCRIPT``): step the
        batch, the worker exchange on the loop (:mod:`.loop_exchange`); the next step
        goes to the worker *before* this step's records are delivered, so that the worker computes
        step n+1 while the loop writes step n's chunks."""
        batcher = self._batcher
        pending: asyncio.Future[wire.OutputFrame] | None = None
        while True:
            if pending is None:
                await self._wait_for_work(busy=bool(batcher.slots))
                if not self.worker.alive():
                    self._fail_slots(batcher.clear(), 500, "the worker process died")
                    await self._restart()
                    continue
                pending = await self._next_step()
                if pending is None:
                    continue
            size = len(batcher.slots)
            try:
                frame = await pending
                results = batcher.apply(frame)
            except WorkerDied as exc:
                self._fail_slots(batcher.clear(), 500, str(exc))
                continue
            except BatchFailure as exc:
                self._fail_slots(batcher.clear(), exc.code, exc.message)
                continue
            finally:
                pending = None
                self._io_lock.release()
                self.in_flight = len(batcher.slots)
            if (batcher.slots or self._queue) and not self._controls and self.worker.alive():
                pending = await self._next_step()
            self.telemetry.rolling_step(results, frame.properties, size)  # off the worker's path
            for slot, record, headers in results:
                self._deliver(slot, record, headers)

    async def _next_step(self) -> asyncio.Future[wire.OutputFrame] | None:
        """Admit waiting requests and send the next step (holding the I/O lock until its reply is
        handled); ``None`` when there is nothing to step."""
        batcher = self._batcher
        self._admit()
        if not batcher.slots:
            return None
        await self._io_lock.acquire()
        properties, content = batcher.build_step()
        self.in_flight = len(batcher.slots)
        assert self._loop is not None
        return start_call(self._loop, self.worker, properties, content)

    def _admit(self) -> None:
        batcher = self._batcher
        while batcher.has_room():
            slot = self._next_admitted()
            if slot is None:
                return
            batcher.add(slot)

    def _next_admitted(self) -> FrontEndSlot | None:
        """The next waiting request that is still wanted, as a slot; ``None`` when none waits."""
        while self._queue:
            request, sink = self._queue.popleft()
            if sink.done:
                continue
            slot = FrontEndSlot(request=WorkerRequest(request.properties, [("data", request.data())]), owner=sink)
            sink.slot = slot
            self.telemetry.admitted(sink.trace)
            return slot
        return None

    def _call_drained(self, properties: dict[str, str], content: list[tuple[str | None, bytes]]) -> Any:
        """Worker thread: one step; a (wrong) streamed reply is read to its end to keep the socket sane."""
        frame = self.worker.call(properties, content)
        if frame.chunks is not None:
            for _ in frame.chunks:
                pass
        return frame

    def _fail_slots(self, slots: list[FrontEndSlot], code: int, message: str) -> None:
        for slot in slots:
            slot.owner.fail(code, _rolling_error(code, message))

    def _deliver(self, slot: FrontEndSlot, record: Record, headers: dict[str, str]) -> None:
        """Apply one record to its slot's HTTP response."""
        self._deliver_to(slot.owner, record, headers)

    def _deliver_to(self, sink: ResponseSink, record: Record, headers: dict[str, str]) -> None:
        """Apply one record to its HTTP response, the way DJL's ``Request.addResponse`` does."""
        if sink.done:
            return  # cancelled or already failed: discard until the slot finishes
        if not sink.started or record.code is not None:  # the head is fixed by the first record only
            merged = dict(headers)
            default = self.settings.default_content_type()
            if default and not any(key.lower() == "content-type" for key in merged):
                merged["Content-Type"] = default
            if record.code is not None:
                sink.fail(record.code, record.error_body(), merged)
                return
            if record.data or record.last:
                sink.start(200, merged)
        if record.data:
            sink.write(record.data.encode("utf-8"))
        if record.last:
            sink.finish()

    # ------------------------------------------------------------------ async mode

    async def _async_loop(self) -> None:
        """DJL's async mode (:mod:`.async_loop`): send each request alone as it is taken, route every
        reply by its tracking id; cancel dropped and overdue requests in the engine."""
        assert self._wake is not None and self._loop is not None
        held = self._async
        channel: StepChannel | None = None
        timeout = self.settings.predict_timeout_s
        try:
            while True:
                self._wake.clear()
                if channel is not None:
                    frames = channel.frames
                    while frames:
                        held.take(frames.popleft(), self._deliver_to)
                    if channel.failure is not None:
                        channel.close()
                        held.fail_all(500, lambda code, why: _rolling_error(code, why), channel.failure)
                        channel = None
                        self._io_lock.release()
                if channel is None:
                    if not self.worker.alive():
                        held.fail_all(500, lambda code, why: _rolling_error(code, why), "the worker process died")
                        await self._restart()
                        continue
                    await self._io_lock.acquire()
                    channel = StepChannel(self._loop, self.worker, self._poke)
                    continue
                self._send_async(channel)
                for tracking in held.overdue(self._loop.time(), timeout):
                    sink = held.held.pop(tracking).owner
                    held.send_cancel(channel, tracking)
                    if isinstance(sink, asyncio.Future):
                        continue  # control calls time out in control()
                    sink.fail(503, _rolling_error(503, f"no reply from the engine within predict_timeout "
                                                       f"({timeout:.0f} s); the request was cancelled"))
                self.in_flight = len(held.held)
                try:
                    await asyncio.wait_for(self._wake.wait(), min(1.0, timeout))
                except asyncio.TimeoutError:
                    pass
        finally:
            if channel is not None:
                channel.close()

    def _send_async(self, channel: StepChannel) -> None:
        """Send every waiting request, cancellation and control call to the worker."""
        held = self._async
        while self._async_controls:
            properties, content, future = self._async_controls.popleft()
            if not future.done():
                held.send_request(channel, properties, content, future)
        while self._queue:
            request, sink = self._queue.popleft()
            if sink.done:
                continue
            self.telemetry.admitted(sink.trace)
            sink.tracking_id = held.send_request(channel, request.properties, [("data", request.data())], sink)
        cancels, self._async_cancels = self._async_cancels, set()
        for tracking in cancels:
            if held.held.pop(tracking, None) is not None:
                held.send_cancel(channel, tracking)


def _record_frame(frame: wire.OutputFrame) -> wire.OutputFrame:
    """An async-mode reply (one record) as the plain frame a control call's caller reads: the
    record's ``code`` (else the frame's) as status, its ``data`` as the body."""
    from djl_handlers.protocol.rolling import decode_record

    if frame.code != 200 or not frame.content:
        return frame
    try:
        record = decode_record(bytes(frame.content[0][1]))
    except ValueError:
        return frame
    properties = {k: v for k, v in frame.properties.items() if k != "request_tracking_id"}
    return wire.OutputFrame(record.code or 200, record.error or frame.message, properties,
                            [(None, record.data.encode("utf-8"))])
