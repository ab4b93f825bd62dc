"""Pytest helpers to run model directories on DJL Serving's real ModelServer (tests/djl_serving/djl_server.py).

Use in a test module::

    from djl_server_fixture import djl_server_fixture, requires_djl  # noqa: F401  (registers the fixture)

    pytestmark = [pytest.mark.djl, requires_djl]

    def test_x(djl_server):
        server = djl_server(MODELS / "echo", OPTION_FOO="bar")
        httpx.post(server.url + "/invocations", json={...})

``djl_server(model_dir, **env)`` returns a started ModelServer for (model dir, env), reusing the
last one when the key is the same; at most one is alive at a time (a JVM and a Python worker on a
small shared machine), the previous one is stopped (whole process group) when another is asked
for, and the last one when the session ends.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DJL_SERVING = ROOT / "tests" / "djl_serving"
MODELS = DJL_SERVING / "models"
if str(DJL_SERVING) not in sys.path:  # djl_server.py is a test tool, not part of the package
    sys.path.insert(0, str(DJL_SERVING))

from djl_server import DjlServer, DjlServerError, find_lib, free_port  # noqa: E402

__all__ = ["DjlServer", "DjlServerError", "free_port", "djl_skip_reason", "requires_djl", "djl_server_fixture"]

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
    """The one live server of the session, keyed by model dir and extra environment."""

    def __init__(self) -> None:
        self._key: tuple[str, tuple[tuple[str, str], ...]] | None = None
        self._server: DjlServer | None = None

    def get(self, model_dir: Path | str, **env: str) -> DjlServer:
        key = (str(Path(model_dir).resolve()), tuple(sorted(env.items())))
        if key == self._key and self._server is not None and self._server.alive():
            return self._server
        self.stop_all()
        self._server = DjlServer(model_dir, env=env).start()
        self._key = key
        return self._server

    def stop_all(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._server, self._key = None, None


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
