"""A worker call made on the event loop itself: the rolling step's exchange without thread hops.

The I/O thread (``runtime``'s single-thread executor) costs each step two thread wake-ups (loop ->
thread, thread -> loop) and, when the loop is busy writing HTTP chunks, a wait for the GIL. Here
the loop writes the step's frame to the worker's socket (non-blocking), lets the worker compute
while it goes on with other work (the previous step's chunks), and is woken by the socket becoming
readable; :func:`.wire.parse_output_frame` tells when the reply is complete. Failures are the
thread path's (:meth:`.WorkerProcess.call`): the worker is killed and :class:`.WorkerDied` raised.

The caller keeps calls from overlapping with the thread path's (control calls, restarts): the
runtime holds its I/O lock from :func:`start_call` until the future is done.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

from djl_handlers.io import wire
from djl_handlers.server.worker_process import WorkerDied, WorkerProcess

__all__ = ["start_call"]

_READ_SIZE = 1 << 18


class _Call:
    """One exchange in progress: writes the frame, collects the reply, resolves ``future``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, worker: WorkerProcess, fd: int, data: bytes) -> None:
        self.loop = loop
        self.worker = worker
        self.fd = fd
        self.future: asyncio.Future[wire.OutputFrame] = loop.create_future()
        self._buffer = b""
        self._out = memoryview(data)
        timeout = worker.spec.predict_timeout_s
        self._timer = loop.call_later(timeout, self._fail, TimeoutError(f"{timeout:.0f}"))
        self._writing = False
        self._write()
        if not self.future.done():
            loop.add_reader(fd, self._on_readable)

    def _write(self) -> None:
        try:
            while self._out:
                sent = os.write(self.fd, self._out)
                self._out = self._out[sent:]
        except BlockingIOError:
            if not self._writing:
                self._writing = True
                self.loop.add_writer(self.fd, self._write)
            return
        except OSError as exc:
            self._fail(exc)
            return
        if self._writing:
            self._writing = False
            self.loop.remove_writer(self.fd)

    def _on_readable(self) -> None:
        """Read what the socket holds (all of it, so that a big reply is parsed once per wake-up,
        not once per read), then try to parse the reply."""
        pieces: list[bytes] = []
        ended = False
        while True:
            try:
                piece = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                self._fail(exc)
                return
            if not piece:
                ended = True
                break
            pieces.append(piece)
            if len(piece) < _READ_SIZE:  # drained for now: spare the read that would say so
                break
        if pieces:
            more = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            self._buffer = self._buffer + more if self._buffer else more
            try:
                parsed = wire.parse_output_frame(self._buffer)
                if parsed is not None and parsed[1] != len(self._buffer):
                    raise ValueError(f"{len(self._buffer) - parsed[1]} unexpected bytes after the reply")
            except ValueError as exc:
                self._fail(exc)
                return
            if parsed is not None:
                self._cleanup()
                self.future.set_result(parsed[0])
                return
        if ended:
            self._fail(EOFError("end of stream"))

    def _cleanup(self) -> None:
        self._timer.cancel()
        if self._writing:
            self._writing = False
            self.loop.remove_writer(self.fd)
        self.loop.remove_reader(self.fd)

    def _fail(self, exc: BaseException) -> None:
        if self.future.done():
            return
        self._cleanup()
        self.worker.kill()
        if isinstance(exc, TimeoutError):
            error = WorkerDied(f"the worker did not answer within {exc} s")
        else:
            error = WorkerDied(f"the worker process died ({type(exc).__name__}: {exc})")
        self.future.set_exception(error)

    def on_done(self, future: asyncio.Future[wire.OutputFrame]) -> None:
        """Stop watching the socket when the future was cancelled (its awaiting task was)."""
        if future.cancelled():
            self._cleanup()


def start_call(loop: asyncio.AbstractEventLoop, worker: WorkerProcess, properties: Mapping[str, str],
               content: list[tuple[str | None, bytes]]) -> asyncio.Future[wire.OutputFrame]:
    """Send one frame to the worker from the running loop; the future resolves to the reply
    (:class:`.WorkerDied` when the worker is not running, dies, or exceeds ``predict_timeout``)."""
    sock = worker.connection()
    if sock is None:
        future: asyncio.Future[wire.OutputFrame] = loop.create_future()
        future.set_exception(WorkerDied("the worker process is not running"))
        return future
    if sock.gettimeout() is None:  # a blocking socket: the thread path sets a timeout (non-blocking fd)
        sock.setblocking(False)
    call = _Call(loop, worker, sock.fileno(), wire.encode_input_frame(properties, content))
    call.future.add_done_callback(call.on_done)
    return call.future
