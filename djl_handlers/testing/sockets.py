"""What an ``Output`` puts on the wire, read back through a real socket pair."""

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
