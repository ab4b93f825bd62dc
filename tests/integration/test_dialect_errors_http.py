"""One error renderer per API dialect, over HTTP: the bytes a client receives parse in the request's
format and carry the error, whether the request fails before anything was sent (the error is the
body, its code the status) or in the middle of a stream (the error is the stream's last event).

The server is ``djl-handlers serve`` on the real pipeline over the fake engine, whose prompt mark
``<fail@N>`` fails a request at its N-th token (see ``djl_handlers.engines.fake``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_seed_http import lmi  # noqa: F401 - the module-scoped server fixture
from test_server_harness import ServerProcess

FAIL = "hello <fail@3>"
MESSAGE = "fake failure at token 3"
PARAMS = {"max_new_tokens": 8}


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> tuple[int, str, str]:
    with server.client() as client:
        response = client.post(path, json=body)
    return response.status_code, response.headers.get("content-type", ""), response.text


def _sse(text: str, prefix: str) -> list[str]:
    """SSE payloads; every byte must belong to a well-formed ``data`` event."""
    assert text.endswith("\n\n"), text
    events = text[:-2].split("\n\n")
    assert all(e.startswith(prefix) and "\n" not in e for e in events), text
    return [e[len(prefix):] for e in events]


def _lines(text: str) -> list[dict[str, Any]]:
    assert text.endswith("\n"), text
    return [json.loads(line) for line in text[:-1].split("\n")]


# ------------------------------------------------------------------ failures before any byte


@pytest.mark.parametrize(
    ("path", "body", "check"),
    [
        ("/invocations", {"inputs": FAIL, "parameters": PARAMS},
         lambda b: b == {"error": MESSAGE, "code": 424}),
        ("/generate", {"inputs": FAIL, "parameters": PARAMS},
         lambda b: b == {"error": MESSAGE, "error_type": "generation"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": FAIL}], "max_tokens": 8},
         lambda b: b["error"] == {"message": MESSAGE, "type": "server_error", "param": None, "code": 424}),
        ("/v1/completions", {"prompt": FAIL, "max_tokens": 8},
         lambda b: b["error"]["type"] == "server_error" and b["error"]["message"] == MESSAGE),
        ("/invocations", {"inputs": FAIL, "parameters": {**PARAMS, "output_formatter": "3p"}},
         lambda b: b["error"] == {"error_code": 424, "error_msg": MESSAGE} and b["body"]["stop_reason"] == "error"),
    ],
    ids=["json", "tgi", "chat_json", "completion_json", "3p"],
)
def test_non_stream_failure_is_the_dialects_error_body(lmi: ServerProcess, path: str, body: dict[str, Any],  # noqa: F811
                                                       check: Any) -> None:
    status, ctype, text = _post(lmi, path, body)
    assert status == 424
    assert ctype.startswith("application/json")
    assert check(json.loads(text)), text


# ------------------------------------------------------------------ failures in the middle of a stream


def test_jsonlines_stream_ends_with_an_error_line(lmi: ServerProcess) -> None:  # noqa: F811
    status, _, text = _post(lmi, "/invocations", {"inputs": FAIL, "stream": True, "parameters": PARAMS})
    lines = _lines(text)
    assert status == 200 and [line["token"]["text"] for line in lines[:2]] != []
    assert lines[-1]["error"] == MESSAGE and lines[-1]["code"] == 424
    assert lines[-1]["details"]["finish_reason"] == "error"


def test_sse_stream_ends_with_an_error_event(lmi: ServerProcess) -> None:  # noqa: F811
    body = {"inputs": FAIL, "stream": True, "parameters": {**PARAMS, "output_formatter": "sse"}}
    status, ctype, text = _post(lmi, "/invocations", body)
    events = [json.loads(p) for p in _sse(text, "data: ")]
    assert status == 200 and ctype.startswith("text/event-stream")
    assert len(events) == 3 and events[-1]["error"] == MESSAGE and events[-1]["code"] == 424


def test_tgi_stream_ends_with_tgis_error_event(lmi: ServerProcess) -> None:  # noqa: F811
    status, _, text = _post(lmi, "/generate_stream", {"inputs": FAIL, "parameters": PARAMS})
    events = [json.loads(p) for p in _sse(text, "data:")]
    assert status == 200 and [e["index"] for e in events[:-1]] == [1, 2]
    assert events[-1] == {"error": MESSAGE, "error_type": "generation"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": FAIL}], "max_tokens": 8, "stream": True}),
        ("/v1/completions", {"prompt": FAIL, "max_tokens": 8, "stream": True}),
    ],
    ids=["chat_sse", "completion_sse"],
)
def test_openai_stream_ends_with_an_error_event_then_done(lmi: ServerProcess, path: str,  # noqa: F811
                                                          body: dict[str, Any]) -> None:
    status, _, text = _post(lmi, path, body)
    payloads = _sse(text, "data: ")
    assert status == 200 and payloads[-1] == "[DONE]"
    events = [json.loads(p) for p in payloads[:-1]]
    assert len(events) == 3 and "choices" in events[0]
    assert events[-1] == {"error": {"message": MESSAGE, "type": "server_error", "param": None, "code": 424}}


def test_3p_stream_ends_with_an_error_line(lmi: ServerProcess) -> None:  # noqa: F811
    body = {"inputs": FAIL, "stream": True, "parameters": {**PARAMS, "output_formatter": "3p_stream"}}
    status, _, text = _post(lmi, "/invocations", body)
    lines = _lines(text)
    assert status == 200 and lines[0]["body"]["generation"]
    assert lines[-1]["error"] == {"error_code": 424, "error_msg": MESSAGE}
    assert lines[-1]["body"]["stop_reason"] == "error"


# ------------------------------------------------------------------ refused requests


def test_refused_requests_get_their_dialects_error(lmi: ServerProcess) -> None:  # noqa: F811
    status, _, text = _post(lmi, "/generate", {"inputs": "x", "parameters": {"do_sample": True, "temperature": 0}})
    assert status == 422
    assert json.loads(text) == {"error": "`temperature` must be strictly positive", "error_type": "validation"}
    status, _, text = _post(lmi, "/v1/completions", {"prompt": "x", "n": 2, "temperature": 0})
    assert status == 400 and json.loads(text)["error"]["type"] == "invalid_request_error"
    status, _, text = _post(lmi, "/invocations", {"inputs": "x", "parameters": {"temprature": 1}})
    assert status == 400 and set(json.loads(text)) == {"error", "code"}
