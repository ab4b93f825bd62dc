"""The OpenAI and TGI routes answer in their own dialect on a dynamic-batch model too, and every
validation error body names its field (docs/server.md, docs/parameters.md).

A real server (``djl-handlers serve``) on the tiny random Llama, over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_server_harness import ServerProcess

pytest_plugins = ["conftest_models"]  # fixture: tiny_dir


def _model(root: Path, tiny_dir: Path, name: str, *lines: str) -> Path:
    model = root / name
    model.mkdir()
    text = ["engine=Python", "option.entryPoint=djl_handlers.huggingface", f"option.model_id={tiny_dir}",
            "option.dtype=fp32", *lines]
    (model / "serving.properties").write_text("\n".join(text) + "\n", encoding="utf-8")
    return model


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[dict[str, ServerProcess]]:
    root = tmp_path_factory.mktemp("dialects")
    started: dict[str, ServerProcess] = {}
    try:
        for name, lines in {
            "dynamic": ("batch_size=2", "max_batch_delay=10", "option.rolling_batch=disable"),
            "dynamic-streaming": ("option.rolling_batch=disable", "option.enable_streaming=true"),
            "rolling": ("option.rolling_batch=scheduler", "option.dtpye=fp32"),
        }.items():
            model = _model(root, tiny_dir, name, *lines)
            if name == "rolling":  # a model.py without handle(): the worker falls back to the HF handler (DJL 0.34)
                (model / "model.py").write_text("def unrelated_helper():\n    return 1\n", encoding="utf-8")
                props = model / "serving.properties"
                props.write_text(props.read_text(encoding="utf-8").replace(
                    "option.entryPoint=djl_handlers.huggingface\n", ""), encoding="utf-8")
            started[name] = ServerProcess(model, root / f"{name}.log")
        yield started
    finally:
        for server in started.values():
            server.stop()


CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


@pytest.mark.parametrize("mode", ["dynamic", "dynamic-streaming", "rolling"])
def test_chat_completions_answers_a_chat_completion_in_every_mode(servers: dict[str, ServerProcess],
                                                                  mode: str) -> None:
    reply = httpx.post(servers[mode].url + "/v1/chat/completions", json=CHAT, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 3 and body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("mode", ["dynamic", "dynamic-streaming"])
def test_streamed_chat_and_completions_and_tgi_on_dynamic_batch(servers: dict[str, ServerProcess], mode: str) -> None:
    url = servers[mode].url
    reply = httpx.post(url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=120)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream"), reply.text
    events = [line[len("data: "):] for line in reply.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and chunks[-1]["choices"][0]["finish_reason"]
    completion = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 2}, timeout=120)
    assert completion.json()["object"] == "text_completion", completion.text
    tgi_body = {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}
    tgi = httpx.post(url + "/generate", json=tgi_body, timeout=120)
    rolling = httpx.post(servers["rolling"].url + "/generate", json=tgi_body, timeout=120)
    assert "\n" not in tgi.text and "\n" not in rolling.text, "TGI's compact JSON, not the indented dynamic list"
    assert [set(item) for item in tgi.json()] == [set(item) for item in rolling.json()] == [{"generated_text"}]


def test_lmi_bodies_keep_the_dynamic_batch_list(servers: dict[str, ServerProcess]) -> None:
    reply = httpx.post(servers["dynamic"].url + "/invocations",
                       json={"inputs": ["Hi", "Yo"], "parameters": {"max_new_tokens": 2}}, timeout=120)
    assert reply.status_code == 200 and [set(item) for item in reply.json()] == [{"generated_text"}] * 2


BAD = {"inputs": "Hi", "parameters": {"temperature": -1}}


def test_start_up_warns_about_unread_keys_and_falls_back_from_model_py(servers: dict[str, ServerProcess]) -> None:
    log = servers["rolling"].log_path.read_text(encoding="utf-8")
    assert "option.dtpye is not read by djl_handlers or DJL Serving; did you mean option.dtype?" in log
    assert "using the recommended entry point djl_handlers.huggingface" in log, log[-3000:]


def test_rolling_validation_error_is_a_400_that_names_the_field(servers: dict[str, ServerProcess]) -> None:
    reply = httpx.post(servers["rolling"].url + "/invocations", json=BAD, timeout=60)
    assert reply.status_code == 400
    assert set(reply.json()) == {"error", "code"} and reply.json()["code"] == 400
    assert "parameters.temperature" in reply.json()["error"]
    unknown = httpx.post(servers["rolling"].url + "/invocations", json={"inputs": "Hi", "colour": 1}, timeout=60)
    assert unknown.status_code == 400 and "colour" in unknown.json()["error"]


def test_dynamic_validation_error_is_200_with_code_400_and_field(servers: dict[str, ServerProcess]) -> None:
    """DJL's dynamic batch sends the handler's body with the batch's status: 200."""
    reply = httpx.post(servers["dynamic"].url + "/invocations", json=BAD, timeout=60)
    assert reply.status_code == 200
    body = reply.json()
    assert (body["code"], body["field"], body["type"]) == (400, "temperature", "invalid_parameter")
    assert body["message"] == "invalid request" and "parameters.temperature" in body["error"]
