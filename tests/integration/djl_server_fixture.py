"""Pytest helpers to run model directories on DJL Serving's real ModelServer (tests/djl_serving/djl_server.py).

Use in a test module::

    from djl_server_fixture import djl_server_fixture, requires_djl  # noqa: F401  (registers the fixture)

    pytestmark = [pytest.mark.djl, requires_djl]

    def test_x(djl_server):
        server = djl_server(MODELS / "echo", OPTION_FOO="bar")                  # DJL Serving 0.34
        server = djl_server(MODELS / "echo", version="0.36", OPTION_FOO="bar")  # DJL Serving 0.36
        httpx.post(server.url + "/invocations", json={...})

``djl_server(model_dir, version="0.34", **env)`` returns a started ModelServer of that release for
(model dir, env), reusing the last one when the key is the same; at most one is alive at a time (a
JVM and a Python worker on a small shared machine), the previous one is stopped (whole process
group) when another is asked for, and the last one when the session ends. ``requires_djl_036``
skips a test where the 0.36 build is missing (``tests/djl_serving/fetch.sh`` builds both);
:data:`DJL_VERSIONS` parametrizes a test over the releases, each case marked with its skip.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DJL_SERVING = ROOT / "tests" / "djl_serving"
MODELS = DJL_SERVING / "models"
if str(DJL_SERVING) not in sys.path:  # djl_server.py is a test tool, not part of the package
    sys.path.insert(0, str(DJL_SERVING))

from djl_server import DEFAULT_VERSION, DjlServer, DjlServerError, find_lib, free_port  # noqa: E402

__all__ = ["DEFAULT_VERSION", "DJL_VERSIONS", "DjlServer", "DjlServerError", "free_port", "djl_skip_reason",
           "requires_djl", "requires_djl_036", "djl_server_fixture", "version_param"]

DjlServerFactory = Callable[..., DjlServer]


def djl_skip_reason(version: str = DEFAULT_VERSION) -> str | None:
    """Why the DJL tests of ``version`` cannot run here, or None when they can."""
    if shutil.which("java") is None:
        return "java is not on PATH (Java 17 is needed for the DJL Serving tests)"
    try:
        find_lib(version=version)
    except DjlServerError as err:
        return str(err)
    return None


requires_djl = pytest.mark.skipif(djl_skip_reason() is not None, reason=djl_skip_reason() or "")
requires_djl_036 = pytest.mark.skipif(djl_skip_reason("0.36") is not None, reason=djl_skip_reason("0.36") or "")
_REQUIRES = {"0.34": requires_djl, "0.36": requires_djl_036}
DJL_VERSIONS: tuple[str, ...] = tuple(_REQUIRES)


def version_param(version: str, *values: object, marks: tuple[pytest.MarkDecorator, ...] = (),
                  id: str | None = None) -> Any:  # noqa: A002 - pytest.param's own keyword
    """``pytest.param(version, *values)`` with the release's skip marker; id ``djl-<version>`` by default."""
    return pytest.param(version, *values, marks=(_REQUIRES[version], *marks), id=id or f"djl-{version}")


class _Servers:
    """The one live server of the session, keyed by release, model dir and extra environment."""

    def __init__(self) -> None:
        self._key: tuple[str, str, tuple[tuple[str, str], ...]] | None = None
        self._server: DjlServer | None = None

    def get(self, model_dir: Path | str, version: str = DEFAULT_VERSION, **env: str) -> DjlServer:
        key = (version, str(Path(model_dir).resolve()), tuple(sorted(env.items())))
        if key == self._key and self._server is not None and self._server.alive():
            return self._server
        self.stop_all()
        reason = djl_skip_reason(version)
        if reason is not None:
            pytest.skip(reason)
        self._server = DjlServer(model_dir, env=env, version=version).start()
        self._key = key
        return self._server

    def stop_all(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._server, self._key = None, None


# One for the whole session. Each test module that imports ``djl_server_fixture`` registers its own
# copy of the fixture (pytest keys fixtures by the module that holds them), so a ``_Servers`` per
# fixture call would keep one live server per module until the session ends; sharing this one keeps
# "at most one alive" true across modules.
_SERVERS = _Servers()


@pytest.fixture(scope="session", name="djl_server")
def djl_server_fixture() -> Iterator[DjlServerFactory]:
    """``djl_server(model_dir, version="0.34", **env) -> DjlServer``: a started server, cached per session."""
    if shutil.which("java") is None:
        pytest.skip("java is not on PATH (Java 17 is needed for the DJL Serving tests)")
    try:
        yield _SERVERS.get
    finally:
        _SERVERS.stop_all()
