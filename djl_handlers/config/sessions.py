"""Stateful-session options (LMI's keys): ``option.enable_stateful_sessions`` (false),
``option.sessions_path`` (where each session keeps its directory; LMI's default ``/dev/shm/djl_sessions``
where ``/dev/shm`` exists, else ``djl_sessions`` in the temporary directory) and
``option.sessions_expiration`` (seconds a session lives after its creation; LMI's 1200).

Sessions are served in DJL's async mode only (as LMI, whose async vLLM service is the one that
reads these keys): :func:`check_sessions_mode` fails the load otherwise, naming the key.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from djl_handlers.config.reader import Reader
from djl_handlers.errors import ConfigError

__all__ = ["DEFAULT_EXPIRATION_S", "SessionOptions", "check_sessions_mode", "default_sessions_path",
           "read_session_options"]

DEFAULT_EXPIRATION_S = 20 * 60  # LMI's session_manager.py default


@dataclass(frozen=True)
class SessionOptions:
    """``enabled``: answer ``requestType`` NEW_SESSION/CLOSE; ``path``: the sessions' root directory
    (None: :func:`default_sessions_path`); ``expiration_s``: each session's lifetime in seconds."""

    enabled: bool = False
    path: str | None = None
    expiration_s: int = DEFAULT_EXPIRATION_S


def default_sessions_path() -> str:
    """LMI's default root: ``/dev/shm/djl_sessions`` where ``/dev/shm`` exists."""
    if os.path.exists("/dev/shm"):
        return "/dev/shm/djl_sessions"
    return os.path.join(tempfile.gettempdir(), "djl_sessions")


def read_session_options(r: Reader) -> SessionOptions:
    """The session options of the properties ``r`` reads."""
    expiration = r.integer("sessions_expiration", DEFAULT_EXPIRATION_S, minimum=1)
    assert expiration is not None
    return SessionOptions(
        enabled=r.boolean("enable_stateful_sessions", False),
        path=r.text("sessions_path"),
        expiration_s=expiration,
    )


def check_sessions_mode(options: SessionOptions, async_mode: bool) -> None:
    """Sessions need DJL's async mode (each request answered alone, with its own headers)."""
    if options.enabled and not async_mode:
        raise ConfigError("option.enable_stateful_sessions=true needs option.async_mode=true "
                          "(sessions are answered in DJL's async mode, as LMI's async service does)",
                          field="option.enable_stateful_sessions")
