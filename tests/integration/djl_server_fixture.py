"""Pytest helpers to run model directories on DJL's real Java code (see djl_handlers.djl_server).

Use in a test module::

    from djl_server_fixture import djl_server_fixture, requires_djl  # noqa: F401  (registers the fixture)

    pytestmark = [pytest.mark.djl, requires_djl]

    def test_x(djl_server):
        server = djl_server(MODELS / "echo", OPTION_FOO="bar")
        httpx.post(server.url + "/invocations", json={...})

``djl_server(model_dir, **env)`` starts at most one server per (model dir, env) for the whole
test session and stops every one of them (whole process group) when the session ends.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from djl_handlers.djl_server import DjlServer, DjlServerError, find_lib

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "djl_serving" / "models"

DjlServerFactory = Callable[..., DjlServer]


def djl_skip_reason() -> str | None:
    """Why the DJL tests cannot run here, or None when they can."""
    if shutil.which("java") is None:
        return "java is not on PATH (Java 17 is needed for the DJL Serving tests)"
    try:
        find_lib()
    except DjlServerError as err:
        return str(err)
    return None


requires_djl = pytest.mark.skipif(djl_skip_reason() is not None, reason=djl_skip_reason() or "")


class _Servers:
    """Session cache of started servers, keyed by model dir and extra environment."""

    def __init__(self) -> None:
        self._servers: dict[tuple[str, tuple[tuple[str, str], ...]], DjlServer] = {}

    def get(self, model_dir: Path | str, **env: str) -> DjlServer:
        key = (str(Path(model_dir).resolve()), tuple(sorted(env.items())))
        server = self._servers.get(key)
        if server is not None and server.alive():
            return server
        if server is not None:
            server.stop()
        server = DjlServer(model_dir, env=env).start()
        self._servers[key] = server
        return server

    def stop_all(self) -> None:
        for server in self._servers.values():
            server.stop()
        self._servers.clear()


@pytest.fixture(scope="session", name="djl_server")
def djl_server_fixture() -> Iterator[DjlServerFactory]:
    """``djl_server(model_dir, **env) -> DjlServer``: a started server, cached per session."""
    reason = djl_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    servers = _Servers()
    try:
        yield servers.get
    finally:
        servers.stop_all()
