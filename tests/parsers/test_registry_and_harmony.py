"""The parser registry's names and errors, gpt-oss's harmony channels (vLLM reads those outside
its reasoning-parser registry, so they are not in the vLLM corpus) and the built-in JSON reading."""

from __future__ import annotations

import pytest

from djl_handlers.errors import ConfigError
from djl_handlers.parsers.registry import reasoning_parser, tool_parser
from djl_handlers.parsers.stream import ReplyStream, read_reply

HARMONY = ("<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final"
           "<|message|>Hello there!<|return|>")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(("key", "lookup"), [("option.reasoning_parser", reasoning_parser),
                                             ("option.tool_call_parser", tool_parser)])
def test_an_unknown_name_names_the_key_and_the_known_names(key, lookup) -> None:
    with pytest.raises(ConfigError) as err:
        lookup("nope")
    assert err.value.field == key
    assert "nope" in str(err.value) and ("deepseek_r1" in str(err.value) or "hermes" in str(err.value))


def test_harmony_reads_the_analysis_channel_as_reasoning() -> None:
    reply = read_reply(HARMONY, reasoning_parser("openai_gptoss"), None, [])
    assert (reply.reasoning, reply.content) == ("User says hi.", "Hello there!")
    assert HARMONY[reply.content_start:].startswith("Hello there!")


def test_harmony_streamed_character_by_character_gives_the_same_fields() -> None:
    stream = ReplyStream(reasoning_parser("openai_gptoss"), None)
    reasoning = content = ""
    for i in range(1, len(HARMONY) + 1):
        delta = stream.feed(HARMONY[:i], i == len(HARMONY))
        reasoning, content = reasoning + delta.reasoning, content + delta.content
        assert "<|" not in delta.reasoning + delta.content
    assert (reasoning, content) == ("User says hi.", "Hello there!")


def test_the_builtin_reading_takes_only_whole_replies_of_known_functions() -> None:
    parser = tool_parser("json")
    call = read_reply('{"name": "get_weather", "arguments": {"city": "Oslo"}}', None, parser, TOOLS)
    assert [(c.name, c.arguments) for c in call.calls] == [("get_weather", '{"city": "Oslo"}')]
    other = read_reply('{"name": "rm_rf", "arguments": {}}', None, parser, TOOLS)
    assert other.calls == [] and other.content == '{"name": "rm_rf", "arguments": {}}'


def test_a_stream_holds_back_a_tail_that_may_become_a_marker() -> None:
    stream = ReplyStream(None, tool_parser("hermes"), TOOLS)
    assert stream.feed("Sure <tool_", False).content == "Sure "
    assert stream.feed("Sure <tool_", True).content == "<tool_"


def test_parallel_tool_calls_false_keeps_the_first_call_whole_and_streamed() -> None:
    import json

    from djl_handlers.dialects.registry import get_formatter
    from djl_handlers.params.generation import GenerationParameters
    from djl_handlers.request.records import Request, RequestOutput, ResponseOptions, Token, ToolPlan

    text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>')
    for parallel, count in ((True, 2), (False, 1)):
        plan = ToolPlan(TOOLS, mode="auto", parallel=parallel, parser="hermes")
        for stream in (False, True):
            request = Request(prompt="p", params=GenerationParameters(), tools=plan,
                              response_options=ResponseOptions("m"))
            out = RequestOutput(request=request, prompt_tokens=3, finished=True, finish_reason="eos_token")
            out.tokens = out.new_tokens = [Token(1, text, -0.1)]
            body = get_formatter("chat_tools_sse" if stream else "chat_json", stream=stream)(out)
            if stream:
                ids = [c["id"] for line in body.split("\n\n") if line.startswith("data: {")
                       for ch in json.loads(line[6:])["choices"] for c in ch["delta"].get("tool_calls", [])
                       if "id" in c]
            else:
                ids = [c["id"] for c in json.loads(body)["choices"][0]["message"]["tool_calls"]]
            assert len(ids) == count, (parallel, stream)


@pytest.mark.parametrize(("reasoning", "tools", "kept"), [
    ("openai_gptoss", "json", True), ("deepseek_r1", "llama3_json", True), ("deepseek_r1", "mistral", True),
    ("deepseek_r1", "hermes", False), ("", "pythonic", False)])
def test_parsers_whose_markers_are_special_tokens_keep_them_in_the_text(reasoning, tools, kept) -> None:
    from djl_handlers.dialects.openai.request import chat_to_lmi

    def template(messages, **kwargs) -> str:
        return "".join(m["content"] for m in messages)

    body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    req = chat_to_lmi(body, template, reasoning=reasoning or None, tool_parser=tools)
    assert (req.parameters.get("skip_special_tokens") is False) == kept
    mine = chat_to_lmi({**body, "skip_special_tokens": True}, template, reasoning=reasoning or None, tool_parser=tools)
    assert mine.parameters.get("skip_special_tokens") is True  # the client's choice wins


def test_a_call_cut_by_the_budget_finishes_with_length() -> None:
    import json

    from djl_handlers.dialects.registry import get_formatter
    from djl_handlers.params.generation import GenerationParameters
    from djl_handlers.request.records import Request, RequestOutput, ResponseOptions, Token, ToolPlan

    plan = ToolPlan(TOOLS, mode="auto", parser="hermes")
    request = Request(prompt="p", params=GenerationParameters(), tools=plan, response_options=ResponseOptions("m"))
    out = RequestOutput(request=request, prompt_tokens=3)
    fmt = get_formatter("chat_tools_sse", stream=True)
    frames = []
    for i, piece in enumerate(['<tool_call>{"name": "get_weather", ', '"arguments": {"city": "Os']):
        token = Token(i, piece, -0.1)
        out.tokens.append(token)
        out.new_tokens = [token]
        if i == 1:
            out.finished, out.finish_reason = True, "length"
        frames.append(fmt(out))
    events = [json.loads(e[6:]) for f in frames for e in f.split("\n\n") if e.startswith("data: {")]
    assert any(c.get("id") for e in events for c in e["choices"][0]["delta"].get("tool_calls", []))
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    whole = json.loads(get_formatter("chat_json", stream=False)(out))["choices"][0]
    assert whole["finish_reason"] == "length" and "tool_calls" not in whole["message"]
