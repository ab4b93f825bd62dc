"""The async-mode gate of LMI's stateful sessions (``djl_python/session_utils.py`` and the session
branch of LMI's async vLLM service), with LMI's answers:

* ``{"requestType": "NEW_SESSION"}`` → 200, body ``{"result": "Session <id> created"}``, header
  ``X-Amzn-SageMaker-Session-Id: <id>; Expires=<UTC, %Y-%m-%dT%H:%M:%SZ>``;
* ``{"requestType": "CLOSE"}`` with the session header → 200, ``{"result": "Session <id> closed"}``,
  header ``X-Amzn-SageMaker-Closed-Session-Id: <id>``; without the header → 424
  ``Failed to close session: invalid session_id: None``;
* a request whose header names an unknown session → 424 ``Input parsing failed: session not found:
  <id>`` (also a CLOSE of it: LMI looks the session up first); an expired session's requests are
  served outside any session; another ``requestType`` → 424 naming the two known ones; with
  sessions off, a ``requestType`` or a session header → 424 ``... stateful sessions not enabled ...``.

A body that has ``prompt``, ``inputs`` or ``messages`` is an inference request whatever its
``requestType`` (LMI checks those first). Errors are async-mode records with ``code`` 424 (DJL's
front end answers that status with ``{"code", "error"}``). The engine is told of each session's
opening and closing (``open_session``/``close_session``, where it has them: the HF engine pins the
session's prefix-cache blocks).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional

from djl_handlers.config.sessions import SessionOptions, default_sessions_path
from djl_handlers.sessions.store import SessionStore

__all__ = ["HEADER_CLOSED_SESSION_ID", "HEADER_SESSION_ID", "Screened", "SessionGate"]

LOG = logging.getLogger(__name__)

HEADER_SESSION_ID = "X-Amzn-SageMaker-Session-Id"
HEADER_CLOSED_SESSION_ID = "X-Amzn-SageMaker-Closed-Session-Id"
REQUEST_TYPES = ("NEW_SESSION", "CLOSE")
INFERENCE_KEYS = ("prompt", "inputs", "messages")
ERROR_CODE = 424  # LMI's code for every session failure


@dataclass
class Screened:
    """What the gate made of one request: ``reply`` (its whole answer: the async-mode record and
    the reply's properties) for a session request or a refused one, else None; ``session``: the
    live session the request is served in (None: none)."""

    reply: Optional[tuple[dict[str, Any], dict[str, str]]] = None
    session: Optional[str] = None


def _error(message: str) -> tuple[dict[str, Any], dict[str, str]]:
    # LMI's record has data "\n", which DJL's front end drops for a record with a code: ours has none
    return {"data": "", "last": True, "error": message, "code": ERROR_CODE}, {}


def _result(text: str, properties: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    return {"data": json.dumps({"result": text}, ensure_ascii=False) + "\n", "last": True}, properties


def request_type(inputs: Any) -> Optional[Any]:
    """The body's ``requestType`` when the body is a JSON object without ``prompt``, ``inputs`` or
    ``messages``; else None."""
    try:
        raw = inputs.get_as_bytes()
    except Exception:  # noqa: BLE001 - a body the parser reports on its own
        return None
    if not isinstance(raw, (bytes, bytearray)) or b"requestType" not in raw:
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict) or "requestType" not in body or any(k in body for k in INFERENCE_KEYS):
        return None
    return body["requestType"]


class SessionGate:
    """Answers session requests and names the session of the others (see the module docstring)."""

    def __init__(self, options: SessionOptions, engine: Any = None) -> None:
        self._engine = engine
        self.store: Optional[SessionStore] = None
        if options.enabled:
            self.store = SessionStore(options.path or default_sessions_path(), options.expiration_s,
                                      on_close=self._closed)
            for session in self.store.sessions.values():  # sessions a previous process left under the root
                if not session.expired():
                    self._opened(session.session_id, session.expiration_ts)

    def screen(self, inputs: Any) -> Screened:
        """The gate's verdict on one request (see :class:`Screened`)."""
        session_id = inputs.get_property(HEADER_SESSION_ID)
        kind = request_type(inputs)
        if session_id is None and kind is None:
            return Screened()
        try:
            live = self._lookup(session_id)
            if kind is None:
                return Screened(session=live)
            if not isinstance(kind, str) or kind not in REQUEST_TYPES:
                keys = "dict_keys([" + ", ".join(repr(k) for k in REQUEST_TYPES) + "])"  # LMI's words
                raise RuntimeError(f"invalid payload. request type must be one of {keys}")
            if self.store is None:
                raise RuntimeError(f"invalid payload. stateful sessions not enabled, {kind} not supported")
        except (RuntimeError, ValueError) as exc:
            return Screened(reply=_error(f"Input parsing failed: {exc}"))
        return Screened(reply=self._create() if kind == "NEW_SESSION" else self._close(session_id))

    def _lookup(self, session_id: Optional[str]) -> Optional[str]:
        if self.store is None:
            if session_id is not None:
                raise RuntimeError(f"invalid payload. stateful sessions not enabled, {HEADER_SESSION_ID} "
                                   "header not supported")
            return None
        session = self.store.get(session_id)
        return session.session_id if session is not None else None

    def _create(self) -> tuple[dict[str, Any], dict[str, str]]:
        assert self.store is not None
        try:
            session = self.store.create()
        except Exception as exc:  # noqa: BLE001 - LMI's answer for any failure
            return _error(f"Failed to create session: {exc}")
        assert session.expiration_ts is not None
        expires = datetime.fromtimestamp(session.expiration_ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._opened(session.session_id, session.expiration_ts)
        LOG.info("Session %s created", session.session_id)
        return _result(f"Session {session.session_id} created",
                       {HEADER_SESSION_ID: f"{session.session_id}; Expires={expires}"})

    def _close(self, session_id: Optional[str]) -> tuple[dict[str, Any], dict[str, str]]:
        assert self.store is not None
        try:
            self.store.close(session_id)
        except Exception as exc:  # noqa: BLE001 - LMI's answer for any failure
            return _error(f"Failed to close session: {exc}")
        LOG.info("Session %s closed", session_id)
        return _result(f"Session {session_id} closed", {HEADER_CLOSED_SESSION_ID: f"{session_id}"})

    def _opened(self, session_id: str, expires: Optional[float]) -> None:
        opener = getattr(self._engine, "open_session", None)
        if callable(opener) and expires is not None:
            opener(session_id, expires)

    def _closed(self, session_id: str) -> None:
        closer = getattr(self._engine, "close_session", None)
        if callable(closer):
            closer(session_id)
