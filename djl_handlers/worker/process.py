"""The worker process: bind a socket, say ``Python engine started.``, serve one connection.

Same command line and behaviour as DJL's ``djl_python_engine.py`` (v0.27), so DJL Serving can start
this worker and ``djl-handlers serve`` can start DJL's:

1. bind the unix socket (a stale socket file is removed; ``<sock>.pid`` records our pid) or the TCP
   port, listen, print exactly ``Python engine started.`` to stdout and flush;
2. accept one connection (30 s timeout);
3. loop: read an ``Input`` frame, add properties ``device_id`` (and ``tensor_parallel_degree`` when
   given on the command line), call the handler (see :mod:`.loader`), send the ``Output`` frame, run
   its ``execute_finalize()``; exit 0 at end of stream. ``djl-handlers serve`` also sends delta frames
   of a worker-driven rolling batch (:mod:`djl_handlers.protocol.worker_steps`): between frames the
   worker then runs steps on its own.

Unlike DJL we never SIGKILL a pid found in an old pid file: we only overwrite it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from djl_handlers.errors import message_of, output_error_body
from djl_handlers.heap import settle
from djl_handlers.io import wire
from djl_handlers.protocol.startup import STARTED_LINE
from djl_handlers.protocol.transport import BufferSink
from djl_handlers.protocol.worker_steps import DELTA
from djl_handlers.worker.loader import HandlerService
from djl_handlers.worker.stepping import FrameReader, Stepper, frame_input

__all__ = ["STARTED_LINE", "build_parser", "main", "serve_connection"]

ACCEPT_TIMEOUT_S = 30.0
_LOG = logging.getLogger("djl_handlers.worker")


def build_parser() -> argparse.ArgumentParser:
    """DJL's worker arguments (unknown extra ones from newer DJL versions are ignored)."""
    parser = argparse.ArgumentParser(prog="python -m djl_handlers.worker",
                                     description="DJL Serving compatible Python worker")
    parser.add_argument("--sock-type", choices=("unix", "tcp"), default="unix")
    parser.add_argument("--sock-name", help="unix socket path, or the host for tcp")
    parser.add_argument("--port", type=int, default=None, help="tcp port")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--entry-point", required=True)
    parser.add_argument("--recommended-entry-point", default=None,
                        help="used when the entry point file has no handler function (DJL 0.34)")
    parser.add_argument("--device-id", default="-1")
    parser.add_argument("--tensor-parallel-degree", default=None)
    parser.add_argument("--async-mode", action=argparse.BooleanOptionalAction, default=False,
                        help="DJL's async mode: each request is awaited alone, replies as they come")
    return parser


def _bind(args: argparse.Namespace) -> socket.socket:
    """A listening socket as DJL's engine creates it."""
    if args.sock_type == "unix":
        if not args.sock_name:
            raise SystemExit("--sock-name is required for --sock-type unix")
        if os.path.exists(args.sock_name):
            os.unlink(args.sock_name)
        with open(f"{args.sock_name}.pid", "w", encoding="utf-8") as handle:
            handle.write(str(os.getpid()))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(args.sock_name)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.sock_name or "127.0.0.1", int(args.port or 19000)))
    sock.listen(128)
    return sock


class _CountingConn:
    """Forwards ``sendall`` to the socket and counts bytes, to know whether a reply had started."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self.sent = 0

    def sendall(self, data: bytes) -> None:
        """Send everything."""
        self._conn.sendall(data)
        self.sent += len(data)


def _send(conn: socket.socket, output: Any) -> None:
    """Send ``output``; a reply that fails before its first byte is replaced by an error reply."""
    counting = _CountingConn(conn)
    try:
        output.send(counting)
    except OSError:
        raise
    except Exception as exc:
        if counting.sent:
            raise
        _LOG.exception("cannot encode the handler's Output")
        body = output_error_body(424, f"cannot encode the handler's Output: {message_of(exc)}")
        conn.sendall(wire.encode_output_frame(
            424, "prediction failure", {"content-type": "application/json"},
            [(None, json.dumps(body).encode("utf-8"))]))


def _encode(output: Any) -> bytes:
    """``output`` as one reply frame in memory (a rolling step's); an error reply if it cannot be encoded."""
    collected = BufferSink()
    try:
        output.send(collected)
    except Exception as exc:
        _LOG.exception("cannot encode the handler's Output")
        body = output_error_body(424, f"cannot encode the handler's Output: {message_of(exc)}")
        return wire.encode_output_frame(424, "prediction failure", {"content-type": "application/json"},
                                        [(None, json.dumps(body).encode("utf-8"))])
    return b"".join(collected.parts)


def _finalize(output: Any) -> None:
    finalize = getattr(output, "execute_finalize", None)
    if callable(finalize):
        try:
            finalize()
        except Exception:
            _LOG.exception("execute_finalize failed")


def serve_connection(conn: socket.socket, service: HandlerService, extra: dict[str, str]) -> None:
    """Answer request frames on ``conn`` until the peer closes it; between frames, run the steps of
    a worker-driven rolling batch (:mod:`djl_handlers.worker.stepping`) while it has requests."""
    reader = FrameReader(conn)
    settled = False
    stepper = Stepper(lambda properties, content: service.invoke(frame_input(properties, content, extra)),
                      _encode, conn.sendall)
    while True:
        try:
            frame = reader.next(block=not stepper.running)
        except EOFError:
            return
        if frame is None:  # nothing waiting: the next step
            _finalize(stepper.step())
            continue
        properties, content = frame
        if DELTA in properties:
            stepper.take(properties, content)
            continue
        output = service.invoke(frame_input(properties, content, extra))
        _send(conn, output)
        _finalize(output)
        if not settled:  # the first frame is the init call: the model is loaded, the heap built
            settled = True
            settle("worker")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the worker; returns the process exit status."""
    args, _unknown = build_parser().parse_known_args(argv)
    logging.basicConfig(stream=sys.stderr, level=os.environ.get("DJL_HANDLERS_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model_dir = os.path.abspath(args.model_dir)
    os.chdir(model_dir)
    if model_dir not in sys.path:
        sys.path.insert(0, model_dir)
    extra = {"device_id": str(args.device_id)}
    if args.tensor_parallel_degree is not None:
        extra["tensor_parallel_degree"] = str(args.tensor_parallel_degree)
    service = HandlerService(args.entry_point, model_dir, args.recommended_entry_point)
    listener = _bind(args)
    print(STARTED_LINE, flush=True)
    listener.settimeout(ACCEPT_TIMEOUT_S)
    try:
        conn, _ = listener.accept()
    except TimeoutError:
        _LOG.error("no front end connected within %.0f s", ACCEPT_TIMEOUT_S)
        return 1
    conn.settimeout(None)
    try:
        if args.async_mode:
            import asyncio

            from djl_handlers.worker.async_serving import serve_async

            asyncio.run(serve_async(conn, service.invoke_async, extra, on_init=lambda: settle("worker")))
        else:
            serve_connection(conn, service, extra)
    except (OSError, ValueError) as exc:
        _LOG.error("connection to the front end failed: %s", exc)
        return 1
    finally:
        conn.close()
        listener.close()
        if args.sock_type == "unix":
            for path in (args.sock_name, f"{args.sock_name}.pid"):
                try:
                    os.unlink(path)
                except OSError:
                    pass
    return 0
