"""Helpers for the local-server tests (no tests here): run ``djl-handlers serve`` as a subprocess.

The server is started on ``--port 0``; its ``djl-handlers: serving NAME at http://HOST:PORT`` line
gives the address. Model directories come from ``tests/integration/models`` (fake handlers) and are
copied to a temporary directory when a test adds properties.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(__file__).resolve().parent / "models"
CLI = "import sys; from djl_handlers.cli import main; sys.exit(main())"
_LISTENING = re.compile(r"djl-handlers: serving (\S+) at (http://\S+)")


def wait_until(predicate: object, what: str, timeout: float = 30) -> None:
    """Poll ``predicate()`` every 50 ms until true; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def cli_command(*args: str) -> list[str]:
    """The ``djl-handlers`` command line run with this interpreter."""
    return [sys.executable, "-c", CLI, *args]


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment with the repository on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra or {})
    return env


def copy_model(tmp_path: Path, name: str, extra: str = "") -> Path:
    """A copy of a fake model directory with ``extra`` lines appended to serving.properties."""
    target = tmp_path / name
    shutil.copytree(MODELS / name, target, ignore=shutil.ignore_patterns("__pycache__"))
    if extra:
        with open(target / "serving.properties", "a", encoding="utf-8") as handle:
            handle.write("\n" + extra.strip() + "\n")
    return target


class ServerProcess:
    """``djl-handlers serve MODEL_DIR --port 0`` in a subprocess."""

    def __init__(self, model_dir: Path, log_path: Path, grace: float = 30.0, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, start_timeout: float = 90.0) -> None:
        """Start the server (extra ``serve`` ``args``, extra ``env``) and wait (at most
        ``start_timeout`` s) for its listening line."""
        self.log_path = log_path
        self._start_timeout = start_timeout
        self._log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cli_command("serve", str(model_dir), "--port", "0", "--grace", str(grace), *args),
            stdout=subprocess.PIPE, stderr=self._log, text=True, env=cli_env(env), cwd=str(ROOT),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.name, self.url = self._wait_listening()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def _wait_listening(self) -> tuple[str, str]:
        deadline = time.monotonic() + self._start_timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            match = _LISTENING.search(line)
            if match:
                return match.group(1), match.group(2)
        self.stop()
        raise AssertionError(f"server did not start; log:\n{self.log_path.read_text()}")

    def client(self, **kwargs: object) -> httpx.Client:
        """An httpx client bound to the server."""
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)  # type: ignore[arg-type]

    def worker_pid(self) -> int:
        """The worker's pid from ``GET /models/{name}``."""
        with self.client() as client:
            return int(client.get(f"/models/{self.name}").json()[0]["workers"][0]["pid"])

    def wait_healthy(self, timeout: float = 60) -> None:
        """Poll ``/ping`` until it answers 200."""
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while time.monotonic() < deadline:
                if client.get("/ping").status_code == 200:
                    return
                time.sleep(0.1)
        raise AssertionError("server never became healthy")

    def stop(self) -> int:
        """SIGTERM, wait, SIGKILL if needed; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[object]:
    """Factory fixture: ``serve(model_dir, grace=...)`` → a started :class:`ServerProcess`."""
    started: list[ServerProcess] = []

    def start(model_dir: Path, grace: float = 30.0) -> ServerProcess:
        server = ServerProcess(model_dir, tmp_path / f"server{len(started)}.log", grace)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def module_server(name: str, extra: str = "") -> object:
    """A module-scoped fixture serving a copy of model ``name`` (one process per test module)."""

    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
        base = tmp_path_factory.mktemp(name)
        server = ServerProcess(copy_model(base, name, extra.replace("{tmp}", str(base))), base / "server.log")
        yield server
        server.stop()

    return fixture


def greedy_replies(url: str, prompts: tuple[str, ...], new: int) -> list[tuple[list[int], str]]:
    """All ``prompts`` at once to ``/invocations``, greedy, ``new`` tokens each (eos ignored): each reply's
    token ids (``details``) and generated text."""
    from concurrent.futures import ThreadPoolExecutor

    def one(prompt: str) -> tuple[list[int], str]:
        body = {"inputs": prompt, "parameters": {"max_new_tokens": new, "do_sample": False, "details": True,
                                                   "ignore_eos_token": True}}
        resp = httpx.post(url + "/invocations", json=body, timeout=180)
        assert resp.status_code == 200, resp.text
        reply = resp.json()
        reply = reply[0] if isinstance(reply, list) else reply
        ids = [int(t["id"][0]) if isinstance(t["id"], list) else int(t["id"]) for t in reply["details"]["tokens"]]
        return ids, str(reply["generated_text"])

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))
