"""LMI's stateful sessions through ``djl-handlers serve`` (real HTTP on 127.0.0.1, async mode, HF
engine with prefix caching, tiny random Llama): create, use, close, unknown and expired sessions
answer with LMI's status codes, headers and bodies; a chat in a session answers as without one and
its later turns hit the prefix cache."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401
from test_server_harness import ServerProcess, wait_until

pytestmark = pytest.mark.slow

HEADER = "X-Amzn-SageMaker-Session-Id"
CLOSED = "X-Amzn-SageMaker-Closed-Session-Id"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
EXPIRATION_S = 4

PROPS = """engine=Python
option.entryPoint=djl_handlers.huggingface
option.model_id={model}
option.dtype=fp32
option.async_mode=true
option.rolling_batch=disable
option.enable_prefix_caching=true
option.enable_stateful_sessions=true
option.sessions_path={root}
option.sessions_expiration={expiration}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[tuple[ServerProcess, Path]]:  # noqa: F811
    folder = tmp_path_factory.mktemp("sessions-model")
    root = tmp_path_factory.mktemp("sessions-root")
    (folder / "serving.properties").write_text(PROPS.format(model=tiny_dir, root=root, expiration=EXPIRATION_S))
    started = ServerProcess(folder, folder / "server.log")
    try:
        yield started, root
    finally:
        started.stop()


def _post(server: ServerProcess, body: dict[str, Any], session: str | None = None,
          route: str = "/invocations") -> Any:
    headers = {HEADER: session} if session is not None else {}
    with server.client() as client:
        return client.post(route, json=body, headers=headers, timeout=120)


def _create(server: ServerProcess) -> str:
    created = _post(server, {"requestType": "NEW_SESSION"})
    assert created.status_code == 200, created.text
    found = re.fullmatch(rf"({UUID}); Expires=(\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", created.headers[HEADER])
    assert found, created.headers
    sid = found.group(1)
    assert created.text == f'{{"result": "Session {sid} created"}}\n'
    assert created.headers["content-type"].startswith("application/json")
    expires = time.strptime(found.group(2), "%Y-%m-%dT%H:%M:%SZ")
    assert abs(time.mktime(expires) - time.mktime(time.gmtime()) - EXPIRATION_S) <= 2
    return sid


def test_create_use_close_and_unknown(server: tuple[ServerProcess, Path]) -> None:
    proc, root = server
    sid = _create(proc)
    assert (root / sid / ".expiration_ts").is_file()
    used = _post(proc, {"inputs": "Deep learning is", "parameters": {"max_new_tokens": 5}}, sid)
    plain = _post(proc, {"inputs": "Deep learning is", "parameters": {"max_new_tokens": 5}})
    assert used.status_code == 200 and used.json() == plain.json()
    unknown = _post(proc, {"inputs": "Hi"}, "00000000-0000-0000-0000-000000000000")
    assert unknown.status_code == 424
    assert unknown.json() == {"error": "Input parsing failed: session not found: 00000000-0000-0000-0000-000000000000",
                              "code": 424}
    bad = _post(proc, {"requestType": "RESUME"})
    assert bad.status_code == 424 and "request type must be one of" in bad.json()["error"]
    no_id = _post(proc, {"requestType": "CLOSE"})
    assert no_id.status_code == 424
    assert no_id.json()["error"] == "Failed to close session: invalid session_id: None"
    closed = _post(proc, {"requestType": "CLOSE"}, sid)
    assert closed.status_code == 200 and closed.headers[CLOSED] == sid
    assert closed.text == f'{{"result": "Session {sid} closed"}}\n'
    assert not (root / sid).exists()
    again = _post(proc, {"requestType": "CLOSE"}, sid)
    assert again.status_code == 424 and again.json()["error"] == f"Input parsing failed: session not found: {sid}"


def _metric(proc: ServerProcess, name: str) -> float:
    with proc.client() as client:
        text = client.get("/metrics").text
    found = re.search(rf"^djl_handlers_{name}_total\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_chat_in_a_session_answers_as_without_and_hits_the_cache(server: tuple[ServerProcess, Path]) -> None:
    proc, _ = server

    def chat(session: str | None) -> list[str]:
        messages: list[dict[str, str]] = [{"role": "system", "content": "You answer briefly and exactly. " * 4}]
        replies = []
        for question in ("What is light?", "And sound?", "Which is faster?"):
            messages.append({"role": "user", "content": question})
            got = _post(proc, {"messages": messages, "max_tokens": 6, "temperature": 0}, session,
                        route="/v1/chat/completions")
            assert got.status_code == 200, got.text
            reply = got.json()["choices"][0]["message"]["content"]
            replies.append(reply)
            messages.append({"role": "assistant", "content": reply})
        return replies

    sid = _create(proc)
    before = _metric(proc, "prefix_cache_hits")
    in_session = chat(sid)
    wait_until(lambda: _metric(proc, "prefix_cache_hits") >= before + 2 * 32, "the later turns' cache hits")
    assert in_session == chat(None)


def test_an_expired_session_is_served_outside_and_can_be_closed(server: tuple[ServerProcess, Path]) -> None:
    proc, root = server
    sid = _create(proc)
    time.sleep(EXPIRATION_S + 1.2)
    served = _post(proc, {"inputs": "Hello", "parameters": {"max_new_tokens": 3}}, sid)
    assert served.status_code == 200 and "generated_text" in served.json()
    closed = _post(proc, {"requestType": "CLOSE"}, sid)  # LMI closes an expired session that is still kept
    assert closed.status_code == 200 and closed.headers[CLOSED] == sid
    expired = _create(proc)
    time.sleep(EXPIRATION_S + 1.2)
    _create(proc)  # a create closes every expired session first
    assert not (root / expired).exists()
