"""LMI's stateful sessions without a model: the store's files, expiry and errors; the gate's
answers (LMI's bodies, headers and 424s); the option checks."""

from __future__ import annotations

import json
import os
import pickle
import re
import time
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.config.models import ServingConfig
from djl_handlers.config.sessions import check_sessions_mode
from djl_handlers.errors import ConfigError
from djl_handlers.io import Input
from djl_handlers.sessions.gate import HEADER_CLOSED_SESSION_ID, HEADER_SESSION_ID, SessionGate
from djl_handlers.sessions.store import SessionStore

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def test_store_creates_expires_closes_and_reloads(tmp_path: Path) -> None:
    closed: list[str] = []
    store = SessionStore(str(tmp_path), expiration_s=60, on_close=closed.append)
    session = store.create()
    assert re.fullmatch(UUID, session.session_id)
    folder = tmp_path / session.session_id
    with open(folder / ".expiration_ts", "rb") as f:  # LMI's file: the expiry as a pickled float
        assert abs(pickle.load(f) - (time.time() + 60)) < 5
    assert store.get(session.session_id) is session
    assert store.get(None) is None and store.get("NEW_SESSION") is None
    with pytest.raises(ValueError, match="session not found: nope"):
        store.get("nope")
    again = SessionStore(str(tmp_path), expiration_s=60)  # a restart loads the root's sessions
    assert again.get(session.session_id) is not None
    store.close(session.session_id)
    assert not folder.exists() and closed == [session.session_id]
    with pytest.raises(ValueError, match="invalid session_id: None"):
        store.close(None)


def test_expired_sessions_are_served_outside_and_closed_by_the_next_create(tmp_path: Path) -> None:
    closed: list[str] = []
    store = SessionStore(str(tmp_path), expiration_s=60, on_close=closed.append)
    old = store.create()
    old.expiration_ts = time.time() - 1
    assert store.get(old.session_id) is None  # expired: no session, no error
    fresh = store.create()
    assert closed == [old.session_id] and not (tmp_path / old.session_id).exists()
    assert store.get(fresh.session_id) is fresh


def test_a_session_file_with_globals_is_not_unpickled(tmp_path: Path) -> None:
    folder = tmp_path / "crafted"
    folder.mkdir()
    (folder / ".expiration_ts").write_bytes(pickle.dumps(os.getcwd))  # a global (a function), not a float
    store = SessionStore(str(tmp_path), expiration_s=60)
    assert store.sessions["crafted"].expiration_ts is None
    assert store.get("crafted") is None  # unreadable counts as expired


class _Engine:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def open_session(self, session: str, expires: float) -> None:
        self.events.append(("open", session))

    def close_session(self, session: str) -> None:
        self.events.append(("close", session))


def _input(body: Any, **headers: str) -> Input:
    return Input.from_parts({"Content-Type": "application/json", **headers}, [("data", json.dumps(body).encode())])


def _gate(tmp_path: Path, enabled: bool = True, engine: Any = None) -> SessionGate:
    config = ServingConfig.from_properties({"model_id": "m", "enable_stateful_sessions": str(enabled).lower(),
                                            "sessions_path": str(tmp_path / "s"), "sessions_expiration": "30"})
    return SessionGate(config.sessions, engine)


def test_gate_answers_as_lmi(tmp_path: Path) -> None:
    engine = _Engine()
    gate = _gate(tmp_path, engine=engine)
    assert gate.screen(_input({"inputs": "hi"})).reply is None  # no header, no requestType: untouched
    record, props = gate.screen(_input({"requestType": "NEW_SESSION"})).reply or ({}, {})
    found = re.fullmatch(rf"({UUID}); Expires=(\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", props[HEADER_SESSION_ID])
    assert found, props
    sid = found.group(1)
    assert record == {"data": json.dumps({"result": f"Session {sid} created"}) + "\n", "last": True}
    assert engine.events == [("open", sid)]
    used = gate.screen(_input({"inputs": "hi", "requestType": "CLOSE"}, **{HEADER_SESSION_ID: sid}))
    assert used.reply is None and used.session == sid  # an inference body whatever its requestType
    unknown = gate.screen(_input({"inputs": "hi"}, **{HEADER_SESSION_ID: "nope"})).reply
    assert unknown is not None and unknown[0]["code"] == 424
    assert unknown[0]["error"] == "Input parsing failed: session not found: nope"
    bad = gate.screen(_input({"requestType": "OPEN"})).reply
    assert bad is not None and bad[0]["error"] == (
        "Input parsing failed: invalid payload. request type must be one of dict_keys(['NEW_SESSION', 'CLOSE'])")
    no_id = gate.screen(_input({"requestType": "CLOSE"})).reply
    assert no_id is not None and no_id[0]["error"] == "Failed to close session: invalid session_id: None"
    record, props = gate.screen(_input({"requestType": "CLOSE"}, **{HEADER_SESSION_ID: sid})).reply or ({}, {})
    assert record["data"] == json.dumps({"result": f"Session {sid} closed"}) + "\n" and "code" not in record
    assert props == {HEADER_CLOSED_SESSION_ID: sid} and engine.events[-1] == ("close", sid)
    again = gate.screen(_input({"requestType": "CLOSE"}, **{HEADER_SESSION_ID: sid})).reply
    assert again is not None and again[0]["error"] == f"Input parsing failed: session not found: {sid}"
    kept = gate.screen(_input({"requestType": "NEW_SESSION"})).reply
    assert kept is not None
    restarted = _Engine()
    _gate(tmp_path, engine=restarted)  # a new process loads the root's live sessions and opens them
    assert restarted.events == [("open", kept[1][HEADER_SESSION_ID].split(";")[0])]


def test_gate_with_sessions_off(tmp_path: Path) -> None:
    gate = _gate(tmp_path, enabled=False)
    assert gate.screen(_input({"inputs": "hi"})).reply is None
    header = gate.screen(_input({"inputs": "hi"}, **{HEADER_SESSION_ID: "x"})).reply
    assert header is not None and header[0]["code"] == 424
    assert "stateful sessions not enabled, X-Amzn-SageMaker-Session-Id header not supported" in header[0]["error"]
    create = gate.screen(_input({"requestType": "NEW_SESSION"})).reply
    assert create is not None
    assert create[0]["error"] == "Input parsing failed: invalid payload. stateful sessions not enabled, " \
                                 "NEW_SESSION not supported"
    assert not (tmp_path / "s").exists()


def test_options_are_checked_naming_the_key() -> None:
    config = ServingConfig.from_properties({"model_id": "m"})
    assert not config.sessions.enabled and config.sessions.expiration_s == 1200
    with pytest.raises(ConfigError, match="option.sessions_expiration"):
        ServingConfig.from_properties({"model_id": "m", "sessions_expiration": "soon"})
    with pytest.raises(ConfigError, match="option.enable_stateful_sessions"):
        ServingConfig.from_properties({"model_id": "m", "enable_stateful_sessions": "maybe"})
    enabled = ServingConfig.from_properties({"model_id": "m", "enable_stateful_sessions": "true"})
    with pytest.raises(ConfigError, match="option.enable_stateful_sessions=true needs option.async_mode=true"):
        check_sessions_mode(enabled.sessions, async_mode=False)
    check_sessions_mode(enabled.sessions, async_mode=True)


def test_the_openapi_document_describes_the_session_header_requests_and_answers() -> None:
    from djl_handlers.server.openapi import openapi_document

    doc = openapi_document(None, "m")
    for route in ("/invocations", "/v1/chat/completions"):
        names = [p["name"] for p in doc["paths"][route]["post"]["parameters"]]
        assert HEADER_SESSION_ID in names
    post = doc["paths"]["/invocations"]["post"]
    bodies = post["requestBody"]["content"]["application/json"]["schema"]["anyOf"]
    assert any(b.get("required") == ["requestType"] for b in bodies)
    assert set(post["responses"]["200"]["headers"]) == {HEADER_SESSION_ID, HEADER_CLOSED_SESSION_ID}


def test_resolving_a_model_dir_gives_sessions_one_worker_and_needs_async_mode(tmp_path: Path) -> None:
    from djl_handlers.config.resolve import resolve_model

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    props = "engine=Python\noption.model_id=.\noption.enable_stateful_sessions=true\n"
    (tmp_path / "serving.properties").write_text(props + "option.async_mode=true\noption.rolling_batch=disable\n")
    resolved = resolve_model(tmp_path, env={})
    assert resolved.server.get("maxWorkers") == "1"  # DJL's recommender: sessions live in one worker
    assert "load_on_devices" not in resolved.server  # DJL's GPU 0 is not copied
    (tmp_path / "serving.properties").write_text(props)
    with pytest.raises(ConfigError, match="option.enable_stateful_sessions=true needs option.async_mode=true"):
        resolve_model(tmp_path, env={})
