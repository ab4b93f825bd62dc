"""Frames through a real socket pair: what an ``Output`` sends, what an ``Input`` reads."""

from __future__ import annotations

import socket
import threading
from typing import Any


def sent_bytes(output: Any) -> bytes:
    """Everything ``output.send`` writes to a socket (DJL's worker calls exactly this)."""
    left, right = socket.socketpair()
    received = bytearray()

    def drain() -> None:
        while chunk := right.recv(65536):
            received.extend(chunk)

    with left, right:
        reader = threading.Thread(target=drain)
        reader.start()
        output.send(left)
        left.shutdown(socket.SHUT_WR)
        reader.join()
    return bytes(received)


def received_input(input_cls: type, frame: bytes) -> Any:
    """An ``input_cls`` (ours or djl_python's ``Input``) filled by its own ``read`` from a socket
    carrying ``frame``."""
    left, right = socket.socketpair()
    with left, right:
        sender = threading.Thread(target=left.sendall, args=(frame,))
        sender.start()
        item = input_cls()
        item.read(right)
        sender.join()
    return item
