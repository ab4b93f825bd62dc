"""One worker call made on the event loop itself: DJL's per-step rolling exchange without thread hops,
for a worker that is not ours (``DJL_HANDLERS_WORKER_SCRIPT``; our own worker drives its rolling
batch itself, ``protocol.worker_steps``).

The I/O thread (``runtime``'s single-thread executor) costs each step two thread wake-ups (loop ->
thread, thread -> loop) and, when the loop is busy writing HTTP chunks, a wait for the GIL. Here the
frame goes out through a :class:`.worker_channel.StepChannel` opened for the call (non-blocking write,
the reply parsed as it arrives, ``predict_timeout`` as a loop timer) and the channel is closed with the
reply. Failures are the thread path's (:meth:`.WorkerProcess.call`): the worker is killed and
:class:`.WorkerDied` raised, also for bytes after the reply.

The caller keeps calls from overlapping with the thread path's (control calls, restarts): the
runtime holds its I/O lock from :func:`start_call` until the future is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from djl_handlers.io import wire
from djl_handlers.server.worker_channel import StepChannel
from djl_handlers.server.worker_process import WorkerDied, WorkerProcess

__all__ = ["start_call"]


def start_call(loop: asyncio.AbstractEventLoop, worker: WorkerProcess, properties: Mapping[str, str],
               content: list[tuple[str | None, bytes]]) -> asyncio.Future[wire.OutputFrame]:
    """Send one frame to the worker from the running loop; the future resolves to the reply
    (:class:`.WorkerDied` when the worker is not running, dies, or exceeds ``predict_timeout``)."""
    future: asyncio.Future[wire.OutputFrame] = loop.create_future()

    def on_event() -> None:
        if future.done():
            return
        if channel.failure is not None:
            future.set_exception(WorkerDied(channel.failure))
        elif channel.frames:
            if channel.buffered or len(channel.frames) > 1:
                channel.fail("the worker process died (ValueError: unexpected bytes after the reply)")
                return
            channel.close()
            future.set_result(channel.frames.popleft())

    channel = StepChannel(loop, worker, on_event)
    if channel.failure is not None:
        future.set_exception(WorkerDied(channel.failure))
        return future
    channel.send((dict(properties), content))
    channel.expect(True)
    future.add_done_callback(lambda done: channel.close() if done.cancelled() else None)
    return future
