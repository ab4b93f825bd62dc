"""vLLM's own parsers on the parser corpus (tests/parsers/corpus.json): what they return, whole and
streamed token by token, is recorded in the corpus's ``vllm`` entries, which our parsers are held to
in the main suite (tests/parsers/test_parser_corpus.py).

Here each entry is checked against vLLM as installed; ``DJL_HANDLERS_RECORD_PARSERS=1`` rewrites the
entries instead (after a vLLM upgrade). Only vLLM's parser modules are imported, never its engine.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.parsers.tokens import CORPUS, corpus, pieces, tokenizer
from tests.vllm_cpu.conftest import REASON

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def _request(tools: list[dict[str, Any]]) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools)


def _reasoning(name: str, tok: Any, text: str, request: Any) -> dict[str, Any]:
    from vllm.reasoning import ReasoningParserManager

    cls = ReasoningParserManager.get_reasoning_parser(name)
    reasoning, content = cls(tok).extract_reasoning(text, request)
    parser = cls(tok)
    streamed = {"reasoning": "", "content": ""}
    prev_text, prev_ids = "", []
    for delta_text, delta_ids in pieces(tok, text):
        cur_text, cur_ids = prev_text + delta_text, prev_ids + delta_ids
        msg = parser.extract_reasoning_streaming(prev_text, cur_text, delta_text, prev_ids, cur_ids, delta_ids)
        if msg is not None:
            streamed["reasoning"] += msg.reasoning or ""
            streamed["content"] += msg.content or ""
        prev_text, prev_ids = cur_text, cur_ids
    return {"whole": {"reasoning": reasoning, "content": content},
            "streamed": {k: v or None for k, v in streamed.items()}}


def _tools(name: str, tok: Any, text: str, request: Any) -> dict[str, Any]:
    from vllm.tool_parsers import ToolParserManager

    cls = ToolParserManager.get_tool_parser(name)
    info = cls(tok, request.tools).extract_tool_calls(text, request)
    whole = {"content": info.content,
             "calls": [{"name": c.function.name, "arguments": c.function.arguments} for c in info.tool_calls]}
    parser = cls(tok, request.tools)
    content, calls = "", {}
    prev_text, prev_ids = "", []
    for delta_text, delta_ids in pieces(tok, text):
        cur_text, cur_ids = prev_text + delta_text, prev_ids + delta_ids
        msg = parser.extract_tool_calls_streaming(prev_text, cur_text, delta_text, prev_ids, cur_ids, delta_ids,
                                                  request)
        if msg is not None:
            content += msg.content or ""
            for call in msg.tool_calls:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                if call.function is not None:
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
        prev_text, prev_ids = cur_text, cur_ids
    return {"whole": whole, "streamed": {"content": content or None, "calls": [calls[i] for i in sorted(calls)]}}


def _run(case: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    tok = tokenizer(tuple(data["markers"][case["parser"]]))
    request = _request(data["tools"])
    run = _reasoning if case["kind"] == "reasoning" else _tools
    return run(case["parser"], tok, case["text"], request)


def test_vllm_parsers_give_the_recorded_readings() -> None:
    data = corpus()
    results = [_run(case, data) for case in data["cases"]]
    if os.environ.get("DJL_HANDLERS_RECORD_PARSERS") == "1":
        for case, result in zip(data["cases"], results, strict=True):
            case["vllm"] = result
        CORPUS.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        return
    for case, result in zip(data["cases"], results, strict=True):
        assert case.get("vllm") == result, (case["parser"], case["text"])


def test_every_parser_name_we_register_is_in_vllms_registries() -> None:
    from djl_handlers.config.models import ServingConfig
    from djl_handlers.engines.external.vllm_parsers import check_vllm_parsers
    from djl_handlers.parsers.registry import REASONING_PARSERS, TOOL_PARSERS

    for reasoning in REASONING_PARSERS:
        for tools in TOOL_PARSERS:
            config = ServingConfig.from_properties({"reasoning_parser": reasoning, "enable_auto_tool_choice": "true",
                                                    "tool_call_parser": tools, "rolling_batch": "vllm"}, engine="vllm")
            check_vllm_parsers(config)


def test_a_name_vllm_lacks_fails_at_load_with_vllms_names() -> None:
    from types import SimpleNamespace

    from djl_handlers.engines.external.vllm_parsers import check_vllm_parsers
    from djl_handlers.errors import ConfigError

    config = SimpleNamespace(chat=SimpleNamespace(reasoning_parser=None, enable_auto_tool_choice=True,
                                                  tool_call_parser="no_such_parser"))
    with pytest.raises(ConfigError) as err:
        check_vllm_parsers(config)
    assert err.value.field == "option.tool_call_parser" and "hermes" in str(err.value)
