"""Reasoning and model-native tool calls over HTTP: ``djl-handlers serve`` with a tiny random
Llama (the SmolLM2 tokenizer), ``option.reasoning_parser=deepseek_r1``,
``option.enable_auto_tool_choice`` with ``option.tool_call_parser=hermes`` and
``option.chat_template`` naming a template written for these tests (ChatML that lists ``tools``).

A random model cannot write a call on purpose, so each request forces its reply with vLLM's
``structured_outputs.regex`` (the literal text, escaped): the HF engine's grammar makes the model
generate exactly that text, token by token, and the reply goes through the real parsers, formatters
and HTTP stack. What comes back must be what vLLM's parsers read in the same text (the corpus
tests compare the parsers themselves), whole and streamed, as the ``openai`` client reads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest_models import embedded_dir, tiny_dir  # noqa: F401
from test_server_harness import ServerProcess

from tests.parsers.chat_cases import MESSAGES, PARSER_OPTIONS, REPLY, TEMPLATE, WEATHER, literal

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[ServerProcess]:  # noqa: F811
    model = tmp_path_factory.mktemp("chat-parsers")
    (model / "tools_chat_template.jinja").write_text(TEMPLATE)
    (model / "serving.properties").write_text("\n".join([
        "engine=Python", "option.entryPoint=djl_handlers.huggingface", f"option.model_id={tiny_dir}",
        "option.rolling_batch=scheduler", "option.dtype=fp32", *PARSER_OPTIONS, ""]))
    proc = ServerProcess(model, model / "server.log")
    yield proc
    proc.stop()


def chat(server: ServerProcess, text: str, **body: Any) -> dict[str, Any]:
    payload = {"model": "m", "messages": MESSAGES, "tools": [WEATHER], "max_tokens": 200,
               "structured_outputs": {"regex": literal(text)}, **body}
    with httpx.Client(base_url=server.url, timeout=300) as http:
        res = http.post("/v1/chat/completions", json=payload)
    assert res.status_code == 200, res.text
    return dict(res.json())


def test_reasoning_and_a_hermes_call_in_one_reply(server: ServerProcess) -> None:
    body = chat(server, REPLY)
    choice = body["choices"][0]
    message = choice["message"]
    assert message["reasoning_content"] == message["reasoning"] == "The user asks about Paris."
    assert message["content"] == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_weather", {"city": "Paris", "days": 2})]
    assert message["tool_calls"][0]["id"].startswith("call_") and choice["finish_reason"] == "tool_calls"
    used = body["usage"]
    assert 0 < used["completion_tokens_details"]["reasoning_tokens"] < used["completion_tokens"]


def test_include_reasoning_false_and_thinking_off(server: ServerProcess) -> None:
    hidden = chat(server, "Short thought.</think>Sunny.", include_reasoning=False)["choices"][0]["message"]
    assert hidden["content"] == "Sunny." and "reasoning_content" not in hidden and "reasoning" not in hidden
    plain = chat(server, "No thinking here.", chat_template_kwargs={"enable_thinking": False})
    message = plain["choices"][0]["message"]
    assert message["content"] == "No thinking here." and "reasoning_content" not in message


def test_openai_stream_helper_reads_the_streamed_call(server: ServerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    extra = {"structured_outputs": {"regex": literal(REPLY)}}
    kinds: list[str] = []
    with client.chat.completions.stream(model="m", messages=MESSAGES, tools=[WEATHER],  # type: ignore[list-item]
                                        max_tokens=200, extra_body=extra) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_completion()
    message = final.choices[0].message
    call = message.tool_calls[0]  # type: ignore[index]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris", "days": 2})
    assert call.id.startswith("call_") and final.choices[0].finish_reason == "tool_calls"
    assert message.content == "Let me check."
    assert "tool_calls.function.arguments.done" in kinds and "content.delta" in kinds


def test_streamed_chunks_have_openai_shapes(server: ServerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    chunks = list(client.chat.completions.create(
        model="m", messages=MESSAGES, tools=[WEATHER], max_tokens=200, stream=True,  # type: ignore[list-item]
        stream_options={"include_usage": True}, extra_body={"structured_outputs": {"regex": literal(REPLY)}}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning == "The user asks about Paris."
    assert sum(1 for d in deltas if (d.model_extra or {}).get("reasoning_content")) > 1  # streamed, not whole
    calls = [t for d in deltas for t in d.tool_calls or []]
    first, rest = calls[0], calls[1:]
    assert first.id and first.type == "function" and first.function and first.function.name == "get_weather"
    assert all(t.id is None and t.type is None and t.function and t.function.name is None for t in rest)
    assert json.loads("".join(t.function.arguments or "" for t in calls if t.function)) == {"city": "Paris", "days": 2}
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens_details.reasoning_tokens > 0  # type: ignore[union-attr]


LANGCHAIN = """
import json, sys
from langchain_openai import ChatOpenAI
url, regex, tool = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
llm = ChatOpenAI(base_url=url + "/v1", api_key="unused", model="m", max_tokens=200, max_retries=0,
                 extra_body={"structured_outputs": {"regex": regex}}).bind_tools([tool])
total = None
for chunk in llm.stream("Weather in Paris for two days?"):
    total = chunk if total is None else total + chunk
print(json.dumps({"calls": [{"name": c["name"], "args": c["args"], "id": c["id"]} for c in total.tool_calls],
                  "content": total.content, "invalid": len(total.invalid_tool_calls)}))
"""


def test_langchain_chat_openai_assembles_the_streamed_call(server: ServerProcess) -> None:
    """LangChain's ChatOpenAI merges our chunks into one tool call: run in this interpreter when
    langchain-openai is installed, else in the one ``DJL_HANDLERS_LANGCHAIN_PYTHON`` names."""
    import importlib.util
    import os
    import subprocess
    import sys

    python = sys.executable if importlib.util.find_spec("langchain_openai") else os.environ.get(
        "DJL_HANDLERS_LANGCHAIN_PYTHON")
    if not python:
        pytest.skip("langchain-openai is not installed (or set DJL_HANDLERS_LANGCHAIN_PYTHON)")
    run = subprocess.run([python, "-c", LANGCHAIN, server.url, literal(REPLY), json.dumps(WEATHER)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["invalid"] == 0 and got["content"] == "Let me check."
    assert [(c["name"], c["args"]) for c in got["calls"]] == [("get_weather", {"city": "Paris", "days": 2})]
    assert got["calls"][0]["id"].startswith("call_")
