"""How the front end's loops reach a handler: :class:`Transport`, "send one frame, get one reply",
implemented over a worker socket (``server.worker_process``) or in process
(``worker.in_process.InProcessTransport``); and :class:`BufferSink`, an ``Output`` encoded in memory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from djl_handlers.io import wire
from djl_handlers.protocol.messages import Content

__all__ = ["BufferSink", "Transport"]


class Transport(Protocol):
    """One request frame in, one reply frame out; callers never overlap calls."""

    def call(self, properties: Mapping[str, str], content: Content) -> wire.OutputFrame:
        """Send a frame and read the reply (a streaming reply's chunks are read lazily)."""
        ...


class BufferSink:
    """A ``sendall`` target collecting bytes (an ``Output`` encoded in memory)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        """Collect ``data``."""
        self.parts.append(bytes(data))
