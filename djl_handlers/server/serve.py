"""Run the local server: start the worker (init call first), then open the port with uvicorn.

SIGTERM/SIGINT start a graceful shutdown: new requests get 503, in-flight ones get up to ``grace``
seconds to finish, the rest fail explicitly, then the worker is stopped and the process exits 0.
A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn

from djl_handlers.heap import settle
from djl_handlers.server.access import AccessSettings
from djl_handlers.server.app import create_app
from djl_handlers.server.runtime import ModelRuntime
from djl_handlers.server.settings import ServerSettings

__all__ = ["DrainingServer", "run_server"]

_LOG = logging.getLogger("djl_handlers.server")


class DrainingServer(uvicorn.Server):
    """uvicorn's server with DJL-style draining on the first signal instead of closing the port."""

    def __init__(self, config: uvicorn.Config, runtime: ModelRuntime, grace_s: float,
                 on_listening: Callable[[str, int], None] | None = None) -> None:
        """``on_listening(host, port)`` runs once the socket accepts connections."""
        super().__init__(config)
        self.runtime = runtime
        self.grace_s = grace_s
        self.on_listening = on_listening
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._drain_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start as uvicorn does, then report the bound address."""
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        if self.should_exit or not self.servers:
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        if self.on_listening is not None:
            self.on_listening(str(host), int(port))

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First signal: drain; second: exit now. (Signals are not re-raised afterwards.)"""
        if self._draining or self._loop is None:
            self.should_exit = True
            self.force_exit = self._draining
            return
        self._draining = True
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        _LOG.info("draining: refusing new requests, waiting up to %.0f s", self.grace_s)
        await self.runtime.drain(self.grace_s)
        self.should_exit = True


def run_server(settings: ServerSettings, host: str, port: int, grace_s: float,
               on_listening: Callable[[str, int], None] | None = None, log_prompts: bool = False,
               access: AccessSettings | None = None) -> int:
    """Start the worker, serve until a signal, return the exit status (StartupError propagates).

    ``log_prompts`` adds the prompt to each finished-request log line (``--log-prompts``);
    ``access``: API key and CORS (``--api-key``, ``--protect-probes``, ``--allowed-origins``)."""
    runtime = ModelRuntime(settings, log_prompts=log_prompts)
    runtime.start_worker()
    try:
        # "auto": uvloop and httptools when installed (the server extra installs them; measured in
        # docs/benchmarks.md, "What the defaults rest on")
        config = uvicorn.Config(create_app(runtime, access), host=host, port=port, lifespan="on",
                                loop=os.environ.get("DJL_HANDLERS_LOOP", "auto"),
                                http=os.environ.get("DJL_HANDLERS_HTTP", "auto"),
                                log_level="warning", access_log=False, timeout_graceful_shutdown=5)
        config.load()  # uvicorn's protocol classes, imported here so that they are part of the settled heap
        server = DrainingServer(config, runtime, grace_s, on_listening)
        settle("front end")
        server.run()
    finally:
        runtime.worker.stop()
    if not server.started:
        print("djl-handlers: the HTTP server could not start", file=sys.stderr)
        return 1
    return 0
