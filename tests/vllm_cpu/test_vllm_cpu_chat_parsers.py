"""Reasoning and tool calls on the vLLM entry point, with real vLLM on the CPU: ``djl-handlers
serve`` with ``djl_handlers.vllm`` on the embedded SmolLM2 and the parser options of
tests/integration/test_chat_parsers_http.py. vLLM's structured output forces the same reply
(a literal regex), and the answer carries the same ``reasoning_content``, content and tool calls,
whole and streamed, as on the HF engine; the parser names were checked in vLLM's registries at load.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest_models import embedded_dir  # noqa: F401 - fixture
from integration.test_server_harness import ServerProcess

from tests.parsers.chat_cases import MESSAGES, PARSER_OPTIONS, REPLY, TEMPLATE, WEATHER, literal
from tests.vllm_cpu.conftest import REASON

pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path) -> Iterator[ServerProcess]:  # noqa: F811
    model = tmp_path_factory.mktemp("vllm-chat-parsers")
    (model / "tools_chat_template.jinja").write_text(TEMPLATE)
    (model / "serving.properties").write_text("\n".join([
        "engine=Python", "option.entryPoint=djl_handlers.vllm", f"option.model_id={embedded_dir}",
        "option.rolling_batch=vllm", "option.dtype=fp32", "option.max_model_len=1024",
        "option.max_rolling_batch_size=4", "option.enforce_eager=true", "option.gpu_memory_utilization=0.3",
        *PARSER_OPTIONS, ""]))
    proc = ServerProcess(model, model / "server.log", start_timeout=400)
    yield proc
    proc.stop()


def test_vllm_entry_point_reads_reasoning_and_calls_as_the_hf_engine(server: ServerProcess) -> None:
    payload: dict[str, Any] = {"model": "m", "messages": MESSAGES, "tools": [WEATHER], "max_tokens": 200,
                               "structured_outputs": {"regex": literal(REPLY)}}
    with httpx.Client(base_url=server.url, timeout=300) as http:
        body = http.post("/v1/chat/completions", json=payload).json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == "The user asks about Paris."
    assert message["content"] == "Let me check." and body["choices"][0]["finish_reason"] == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_weather", {"city": "Paris", "days": 2})]
    assert 0 < body["usage"]["completion_tokens_details"]["reasoning_tokens"] < body["usage"]["completion_tokens"]

    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with client.chat.completions.stream(model="m", messages=MESSAGES, tools=[WEATHER],  # type: ignore[arg-type]
                                        max_tokens=200, extra_body={"structured_outputs": {"regex": literal(REPLY)}}
                                        ) as stream:
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris", "days": 2})
