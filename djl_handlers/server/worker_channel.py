"""The worker's socket on the event loop, for a worker-driven rolling batch (``protocol.worker_steps``).

Frames to the worker are written without blocking (what the socket does not take is written when it
becomes writable, in order); replies are read whenever the socket is readable, parsed as they
complete (:func:`.wire.parse_output_frame`) and queued in :attr:`StepChannel.frames`, and
``on_event`` is called so the runtime's loop wakes once per batch of replies. A read error, the end of
the stream, a corrupt reply or no reply within ``predict_timeout`` while one is expected kills the
worker and sets :attr:`StepChannel.failure`. While a channel is open nothing else may use the socket:
the runtime closes it (between steps, the worker paused) before a control call on the I/O thread.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Callable

from djl_handlers.io import wire
from djl_handlers.protocol.messages import Frame
from djl_handlers.server.worker_process import WorkerProcess

__all__ = ["StepChannel"]

_READ_SIZE = 1 << 18


class StepChannel:
    """Frames in both directions on the worker's socket, driven by the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, worker: WorkerProcess, on_event: Callable[[], None]) -> None:
        self.loop = loop
        self.worker = worker
        self.frames: deque[wire.OutputFrame] = deque()
        self.failure: str | None = None
        self._on_event = on_event
        self._buffer = b""
        self._out: deque[memoryview] = deque()
        self._writing = False
        self._timer: asyncio.TimerHandle | None = None
        self._expecting = False
        sock = worker.connection()
        if sock is None:
            self.fd = -1
            self.failure = "the worker process is not running"
            return
        if sock.gettimeout() is None:  # blocking: the thread path's timeout already made the fd non-blocking
            sock.setblocking(False)
        self.fd = sock.fileno()
        loop.add_reader(self.fd, self._on_readable)

    @property
    def buffered(self) -> int:
        """Bytes received after the last whole reply (the start of the next one)."""
        return len(self._buffer)

    # ------------------------------------------------------------------ writing

    def send(self, frame: Frame) -> None:
        """Queue one request frame for the worker."""
        if self.failure is not None:
            return
        self._out.append(memoryview(wire.encode_input_frame(*frame)))
        if not self._writing:
            self._write()

    def _write(self) -> None:
        try:
            while self._out:
                head = self._out[0]
                sent = os.write(self.fd, head)
                if sent < len(head):
                    self._out[0] = head[sent:]
                    continue
                self._out.popleft()
        except BlockingIOError:
            if not self._writing:
                self._writing = True
                self.loop.add_writer(self.fd, self._write)
            return
        except OSError as exc:
            self.fail(f"the worker process died ({type(exc).__name__}: {exc})")
            return
        if self._writing:
            self._writing = False
            self.loop.remove_writer(self.fd)

    # ------------------------------------------------------------------ reading

    def expect(self, expecting: bool) -> None:
        """Whether a reply is due (the worker holds requests or owes an answer): arms the
        ``predict_timeout`` timer, restarted by every reply."""
        if expecting == self._expecting:
            return
        self._expecting = expecting
        if expecting:
            self._arm()
        elif self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        timeout = self.worker.spec.predict_timeout_s
        self._timer = self.loop.call_later(timeout, self.fail, f"the worker did not answer within {timeout:.0f} s")

    def _on_readable(self) -> None:
        data, ended = self._read_all()
        if data:
            self._parse(data)
        if ended:
            self.fail("the worker process died (EOFError: end of stream)")

    def _read_all(self) -> tuple[bytes, bool]:
        """What the socket holds (all of it: a big reply is parsed once per wake-up) and whether the
        stream ended."""
        pieces: list[bytes] = []
        while True:
            try:
                piece = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                self.fail(f"the worker process died ({type(exc).__name__}: {exc})")
                return b"", False
            if not piece:
                return b"".join(pieces), True
            pieces.append(piece)
            if len(piece) < _READ_SIZE:  # drained for now: spare the read that would say so
                break
        return (pieces[0] if len(pieces) == 1 else b"".join(pieces)), False

    def _parse(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        got = False
        while buffer:
            try:
                parsed = wire.parse_output_frame(buffer)
            except ValueError as exc:
                self.fail(f"the worker process died (ValueError: {exc})")
                return
            if parsed is None:
                break
            self.frames.append(parsed[0])
            buffer = buffer[parsed[1]:]
            got = True
        self._buffer = buffer
        if got:
            if self._expecting:
                self._arm()
            self._on_event()

    # ------------------------------------------------------------------ ending

    def fail(self, why: str) -> None:
        """Kill the worker: it died, broke the protocol or stopped answering."""
        if self.failure is not None:
            return
        self.failure = why
        self.close()
        self.worker.kill()
        self._on_event()

    def close(self) -> None:
        """Stop watching the socket (the worker keeps running); frames already parsed stay queued."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.fd < 0:
            return
        if self._writing:
            self._writing = False
            self.loop.remove_writer(self.fd)
        self.loop.remove_reader(self.fd)
        self.fd = -1
