"""One worker process per model, spoken to over a unix socket (DJL's ``PyProcess``/``Connection``).

:class:`WorkerProcess` starts our worker (``python -m`` ``protocol.startup.WORKER_MODULE``; or, with
env ``DJL_HANDLERS_WORKER_SCRIPT``, any script taking DJL's worker arguments, e.g. DJL's own
``djl_python_engine.py``) with the model directory as working directory and ``PYTHONPATH`` = the
directory holding ``djl_handlers`` + the model directory + the existing ``PYTHONPATH``; waits for
``Python engine started.`` on its stdout; connects; sends the init call. All methods block, so the
server calls them from one dedicated thread; calls never overlap.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from djl_handlers.io import wire
from djl_handlers.openmp import openmp_defaults
from djl_handlers.protocol.startup import STARTED_LINE, WORKER_MODULE, recommended_for

__all__ = ["StartupError", "WorkerDied", "WorkerProcess", "WorkerSpec"]

_LOG = logging.getLogger("djl_handlers.server.worker")
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_CONNECT_ATTEMPTS = 50


class WorkerDied(Exception):
    """The worker process exited, closed the socket, sent garbage or timed out."""


class StartupError(Exception):
    """The worker could not be started or its init call answered >= 300."""


@dataclass
class WorkerSpec:
    """Everything needed to (re)start a worker."""

    model_dir: str
    entry_point: str
    init_properties: dict[str, str]
    device_id: str = "-1"
    predict_timeout_s: float = 120.0
    loading_timeout_s: float = 240.0
    start_timeout_s: float = 120.0
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable
    async_mode: bool = False  # DJL's --async-mode: requests are sent alone and answered as they finish


def _pythonpath(model_dir: str) -> str:
    """Our package root + the model directory + whatever PYTHONPATH already holds."""
    parts = [str(_PACKAGE_ROOT), model_dir]
    existing = os.environ.get("PYTHONPATH")
    if existing:
        parts.append(existing)
    return os.pathsep.join(parts)


class WorkerProcess:
    """A worker process and its connection; implements :class:`.protocol.Transport`."""

    def __init__(self, spec: WorkerSpec) -> None:
        """Nothing starts until :meth:`start`."""
        self.spec = spec
        self.process: subprocess.Popen[str] | None = None
        self.restarts = -1
        self._sock: socket.socket | None = None
        self._reader: object | None = None
        self._dir: str | None = None
        self.ready = False

    # ------------------------------------------------------------------ lifecycle

    @property
    def pid(self) -> int | None:
        """The worker's pid while it runs."""
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        """True when the process runs and has answered its init call."""
        return self.ready and self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the process, connect and send the init call; :class:`StartupError` on failure."""
        self.stop()
        self.restarts += 1
        self._dir = tempfile.mkdtemp(prefix="djlh-")
        sock_path = os.path.join(self._dir, f"djl_sock.{19000 + self.restarts}")
        self.process = subprocess.Popen(
            self._command(sock_path), cwd=self.spec.model_dir, env=self._env(),
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, bufsize=1,
        )
        self._wait_started()
        self._connect(sock_path)
        self._init()
        self.ready = True

    @staticmethod
    def drives_steps() -> bool:
        """True when the worker is ours (``WORKER_MODULE``), which runs rolling steps on its own
        (``protocol.worker_steps``); a ``DJL_HANDLERS_WORKER_SCRIPT`` worker speaks DJL's protocol only."""
        return not os.environ.get("DJL_HANDLERS_WORKER_SCRIPT")

    def _command(self, sock_path: str) -> list[str]:
        script = os.environ.get("DJL_HANDLERS_WORKER_SCRIPT")
        head = [self.spec.python, script] if script else [self.spec.python, "-m", WORKER_MODULE]
        command = head + [
            "--sock-type", "unix", "--sock-name", sock_path, "--model-dir", self.spec.model_dir,
            "--entry-point", self.spec.entry_point, "--device-id", self.spec.device_id,
            "--async-mode" if self.spec.async_mode else "--no-async-mode",
        ]
        recommended = recommended_for(self.spec.entry_point, self.spec.model_dir)
        if recommended:  # DJL 0.34 passes it too: the fallback when model.py has no handler function
            command += ["--recommended-entry-point", recommended]
        return command

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.spec.env)
        env["PYTHONPATH"] = _pythonpath(self.spec.model_dir)
        env.setdefault("PYTHONUNBUFFERED", "1")
        openmp_defaults(env)
        return env

    def _wait_started(self) -> None:
        """Read stdout until the start line (forwarding it to our log), then keep forwarding."""
        assert self.process is not None and self.process.stdout is not None
        stdout = self.process.stdout
        found = threading.Event()

        def pump() -> None:
            for line in stdout:
                if STARTED_LINE in line:
                    found.set()
                _LOG.info("[worker] %s", line.rstrip())
            found.set()

        threading.Thread(target=pump, name="worker-stdout", daemon=True).start()
        found.wait(self.spec.start_timeout_s)
        if self.process.poll() is not None:
            raise StartupError(f"worker exited with status {self.process.returncode} before it started"
                               " (see its log above)")
        if not found.is_set():
            raise StartupError(f"worker did not print {STARTED_LINE!r} within {self.spec.start_timeout_s} s")

    def _connect(self, sock_path: str) -> None:
        for _ in range(_CONNECT_ATTEMPTS):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(sock_path)
            except OSError:
                sock.close()
                time.sleep(0.1)
                continue
            self._sock = sock
            self._reader = sock.makefile("rb")
            return
        raise StartupError(f"cannot connect to the worker socket {sock_path}")

    def _init(self) -> None:
        try:
            frame = self._exchange(self.spec.init_properties, [], self.spec.loading_timeout_s)
        except WorkerDied as exc:
            raise StartupError(f"model initialization failed: {exc}") from exc
        if frame.chunks is not None:
            for _ in frame.chunks:
                pass
        if frame.code >= 300:
            detail = wire_text(frame)
            what = "out of memory" if frame.code == 507 else "Failed to initialize model"
            raise StartupError(f"{what} ({frame.code} {frame.message}){': ' + detail if detail else ''}")

    def stop(self) -> None:
        """Close the socket (the worker exits at end of stream) and make sure the process is gone."""
        self.ready = False
        if self._sock is not None:
            try:  # shutdown first: the makefile() reader would keep the descriptor open
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        if self._reader is not None:
            self._reader.close()  # type: ignore[attr-defined]
            self._reader = None
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def kill(self) -> None:
        """Kill the process at once (after a timeout or a protocol error)."""
        self.ready = False
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self.stop()

    # ------------------------------------------------------------------ calls

    def connection(self) -> socket.socket | None:
        """The connected socket while the process runs (for :mod:`.worker_channel`), else ``None``."""
        if self._sock is None or self.process is None or self.process.poll() is not None:
            return None
        return self._sock

    def call(self, properties: Mapping[str, str], content: list[tuple[str | None, bytes]]) -> wire.OutputFrame:
        """Send one frame and read the reply; :class:`WorkerDied` if the worker is gone."""
        return self._exchange(properties, content, self.spec.predict_timeout_s)

    def _exchange(self, properties: Mapping[str, str], content: list[tuple[str | None, bytes]],
                  timeout: float) -> wire.OutputFrame:
        if self._sock is None or self.process is None or self.process.poll() is not None:
            raise WorkerDied("the worker process is not running")
        try:
            self._sock.settimeout(timeout)
            self._sock.sendall(wire.encode_input_frame(properties, content))
            frame = wire.read_output_frame(self._reader)  # type: ignore[arg-type]
        except TimeoutError as exc:
            self.kill()
            raise WorkerDied(f"the worker did not answer within {timeout:.0f} s") from exc
        except (OSError, EOFError, ValueError) as exc:
            self.kill()
            raise WorkerDied(f"the worker process died ({type(exc).__name__}: {exc})") from exc
        if frame.chunks is not None:
            frame.chunks = self._guard(frame.chunks)
        return frame

    def _guard(self, chunks: Iterator[tuple[bytes, bool]]) -> Iterator[tuple[bytes, bool]]:
        """Turn a broken stream into :class:`WorkerDied`."""
        try:
            yield from chunks
        except (OSError, EOFError, ValueError) as exc:
            self.kill()
            raise WorkerDied(f"the worker process died while streaming ({exc})") from exc


def wire_text(frame: wire.OutputFrame) -> str:
    """A reply's body as text, for error messages (JSON ``error`` field when present)."""
    import json

    body = b"".join(value for _, value in (frame.content or [])[:1]).decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if isinstance(parsed, dict) and parsed.get("error"):
        return str(parsed["error"])
    return body
