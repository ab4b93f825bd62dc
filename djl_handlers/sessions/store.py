"""The session store, as LMI's ``djl_python/session_manager.py`` keeps it.

Each session is a directory named by its UUID under the sessions root, holding ``.expiration_ts``
(the expiry as a pickled float, LMI's file, so a root LMI wrote loads here and the other way
round). Sessions found under the root at start are loaded. Creating a session first closes every
expired one (LMI's only clean-up); looking up an expired session answers None (the request is then
served outside any session) and an unknown one is an error.

The pickle is read with an unpickler that refuses every global: a float needs none, so a crafted
file under the root cannot run code.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["Session", "SessionStore"]

LOG = logging.getLogger(__name__)
EXPIRATION_FILE = ".expiration_ts"


class _FloatOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a session file")


@dataclass
class Session:
    """One session: its id, its directory and when it expires (epoch seconds; None: unknown)."""

    session_id: str
    files_path: str
    expiration_ts: Optional[float]

    def expired(self, now: Optional[float] = None) -> bool:
        """True once its expiry has passed (a session without one counts as expired)."""
        return self.expiration_ts is None or (time.time() if now is None else now) > self.expiration_ts


def _read_expiration(folder: str) -> Optional[float]:
    path = os.path.join(folder, EXPIRATION_FILE)
    try:
        with open(path, "rb") as f:
            value = _FloatOnly(io.BytesIO(f.read())).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError):
        LOG.warning("session file %s is unreadable; the session counts as expired", path)
        return None
    return float(value) if isinstance(value, (int, float)) else None


class SessionStore:
    """Create, look up and close sessions under ``root`` (see the module docstring); ``on_close`` is
    told the id of every session closed, by a client or as expired."""

    def __init__(self, root: str, expiration_s: int, on_close: Optional[Callable[[str], None]] = None) -> None:
        self.root = root
        self.expiration_s = expiration_s
        self._on_close = on_close
        os.makedirs(root, exist_ok=True)
        self.sessions: dict[str, Session] = {}
        for name in sorted(os.listdir(root)):
            folder = os.path.join(root, name)
            if os.path.isdir(folder):
                self.sessions[name] = Session(name, folder, _read_expiration(folder))

    def create(self) -> Session:
        """A new session (expired ones are closed first); its directory and expiry file are written."""
        for session_id in [s.session_id for s in self.sessions.values() if s.expired()]:
            self.close(session_id)
        session_id = str(uuid.uuid4())
        session = Session(session_id, os.path.join(self.root, session_id), time.time() + self.expiration_s)
        os.makedirs(session.files_path)
        with open(os.path.join(session.files_path, EXPIRATION_FILE), "wb") as f:
            pickle.dump(session.expiration_ts, f)
        self.sessions[session_id] = session
        return session

    def get(self, session_id: Optional[str]) -> Optional[Session]:
        """The live session ``session_id`` names; None for no id, ``NEW_SESSION`` or an expired
        session; ``ValueError`` for an unknown id (LMI's rule and message)."""
        if not session_id or session_id == "NEW_SESSION":
            return None
        session = self.sessions.get(session_id)
        if session is None:
            raise ValueError(f"session not found: {session_id}")
        if session.expired():
            LOG.info("Session expired: %s", session_id)
            return None
        return session

    def close(self, session_id: Optional[str]) -> Session:
        """Close ``session_id`` (expired or not) and remove its directory; ``ValueError`` with LMI's
        message when there is no id or no such session."""
        if not session_id:
            raise ValueError(f"invalid session_id: {session_id}")
        session = self.sessions.get(session_id)
        if session is None:
            raise ValueError(f"session not found: {session_id}")
        if not os.path.exists(session.files_path):
            raise ValueError(f"session directory does not exist: {session_id}")
        LOG.info("closing session: %s", session_id)
        shutil.rmtree(session.files_path)
        del self.sessions[session_id]
        if self._on_close is not None:
            self._on_close(session_id)
        return session
