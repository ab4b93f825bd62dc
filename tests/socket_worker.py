"""The slice of ``WorkerProcess`` the event-loop exchanges use (``connection``, ``kill``,
``spec.predict_timeout_s``), on one end of a socket pair: for tests of server/loop_exchange.py and
server/worker_channel.py."""

from __future__ import annotations

import socket
from types import SimpleNamespace


class SocketWorker:
    """A worker that is only a connected socket; ``kill`` closes it, as the process's death would
    (``close_on_kill=False`` keeps it open, to see what the caller does without the close)."""

    def __init__(self, sock: socket.socket, timeout: float = 5.0, close_on_kill: bool = True) -> None:
        self.sock: socket.socket | None = sock
        self.spec = SimpleNamespace(predict_timeout_s=timeout)
        self.killed = False
        self.close_on_kill = close_on_kill

    def connection(self) -> socket.socket | None:
        return self.sock

    def kill(self) -> None:
        self.killed = True
        if self.close_on_kill and self.sock is not None:
            self.sock.close()
            self.sock = None
