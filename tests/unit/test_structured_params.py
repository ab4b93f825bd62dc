"""Structured output and tool calling on the request side (no model): the ``guided_*``/TGI
``grammar`` parameters, OpenAI ``response_format``/``tools``, the translations to vLLM and
TensorRT-LLM (against the fakes), and the ``tool_calls`` replies."""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest

from djl_handlers.dialects.openai.request import chat_to_lmi, completion_to_lmi
from djl_handlers.errors import InvalidParameter, InvalidRequest
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.params.structured import StructuredOutput, choice_regex
from djl_handlers.params.translate import to_trtllm, to_vllm
from djl_handlers.request.records import ResponseOptions, ToolPlan

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["a"]}


def gp(data: dict[str, Any], engine: str = "huggingface") -> GenerationParameters:
    return GenerationParameters.from_dict(data, engine)


@pytest.mark.parametrize(
    ("data", "kind", "value"),
    [
        ({"guided_json": SCHEMA}, "json", json.dumps(SCHEMA, separators=(",", ":"))),
        ({"guided_json": json.dumps(SCHEMA)}, "json", json.dumps(SCHEMA, separators=(",", ":"))),
        ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+"),
        ({"guided_choice": ["yes", "no"]}, "choice", ("yes", "no")),
        ({"guided_grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
        ({"guided_json_object": True}, "json_object", None),
        ({"grammar": {"type": "json", "value": SCHEMA}}, "json", json.dumps(SCHEMA, separators=(",", ":"))),
        ({"grammar": {"type": "regex", "value": "a|b"}}, "regex", "a|b"),
    ],
)
@pytest.mark.parametrize("engine", ["huggingface", "deepspeed", "vllm", "lmi-dist", "tensorrt_llm"])
def test_every_spelling_is_one_field_on_every_engine(data: dict[str, Any], kind: str, value: Any, engine: str) -> None:
    p = gp(data, engine)
    assert p.structured_output is not None
    assert (p.structured_output.kind, p.structured_output.value) == (kind, value)
    assert p.structured_output.source in p.provided


def test_schema_key_order_is_kept_and_equal_constraints_hash_equal() -> None:
    a = gp({"guided_json": SCHEMA}).structured_output
    b = gp({"guided_json": json.dumps(SCHEMA, indent=2)}).structured_output
    assert a == b and hash(a) == hash(b)
    assert list(a.schema["properties"]) == ["b", "a"]  # type: ignore[union-attr]


def test_nothing_asked() -> None:
    assert gp({}).structured_output is None
    assert gp({"guided_json_object": False, "guided_json": None}).structured_output is None


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"guided_json": [1]}, "guided_json", "must be a JSON Schema object"),
        ({"guided_json": {"type": "objectx"}}, "guided_json", '"objectx" is not a JSON Schema type'),
        ({"guided_json": {"properties": {"a": {"type": "strin"}}}}, "guided_json", "properties.a.type"),
        ({"guided_json": {"required": "a"}}, "guided_json", "required must be a list"),
        ({"guided_json": {"anyOf": []}}, "guided_json", "anyOf must be a non-empty list"),
        ({"guided_regex": ""}, "guided_regex", "non-empty string"),
        ({"guided_choice": []}, "guided_choice", "non-empty list"),
        ({"guided_choice": ["a", 1]}, "guided_choice", "non-empty list of non-empty strings"),
        ({"guided_grammar": 3}, "guided_grammar", "EBNF grammar"),
        ({"guided_json_object": "yes"}, "guided_json_object", "true or false"),
        ({"grammar": {"type": "xml", "value": "x"}}, "grammar", 'must be "json" or "regex"'),
        ({"grammar": "[0-9]"}, "grammar", '"type": "json" or "regex"'),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "at most one"),
        ({"guided_regex": "a+", "min_new_tokens": 3}, "min_new_tokens", "cannot be combined with parameters.guided_"),
    ],
)
def test_bad_constraints_name_the_field(data: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(InvalidParameter, match=message) as info:
        gp(data)
    assert info.value.field == field


def test_typo_suggests_the_structured_field() -> None:
    with pytest.raises(InvalidParameter, match="did you mean guided_json"):
        gp({"guided_jsn": {}})


def test_vllm_translation() -> None:
    assert to_vllm(gp({"guided_json": SCHEMA}, "vllm"))["structured_outputs"] == {"json": SCHEMA}
    assert to_vllm(gp({"guided_choice": ["a", "b"]}, "vllm"))["structured_outputs"] == {"choice": ["a", "b"]}
    assert to_vllm(gp({"guided_json_object": True}, "vllm"))["structured_outputs"] == {"json_object": True}
    assert to_vllm(gp({"guided_grammar": "root ::= x"}, "vllm"))["structured_outputs"] == {"grammar": "root ::= x"}
    assert "structured_outputs" not in to_vllm(gp({}, "vllm"))


def test_trtllm_translation_turns_choice_into_a_regex() -> None:
    import re

    guided = to_trtllm(gp({"guided_choice": ["a.b", "c|d"]}, "tensorrt_llm"))["guided_decoding"]
    pattern = re.compile(guided["regex"])
    assert pattern.fullmatch("a.b") and pattern.fullmatch("c|d") and not pattern.fullmatch("axb")
    assert to_trtllm(gp({"guided_regex": "x+"}, "tensorrt_llm"))["guided_decoding"] == {"regex": "x+"}
    assert choice_regex(("(", "]")) == r"(\(|\])"


# --------------------------------------------------------------------------- OpenAI requests

MESSAGES = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


class Template:
    """A chat template stand-in that records what it was given."""

    def __init__(self, reads_tools: bool) -> None:
        self.reads_tools = reads_tools
        self.calls: list[tuple[list[dict[str, Any]], Any]] = []

    def __call__(self, messages: list[dict[str, Any]], tools: Any = None) -> str:
        self.calls.append((messages, tools))
        return json.dumps(messages)


def chat(body: dict[str, Any], reads_tools: bool = False) -> tuple[Any, Template]:
    template = Template(reads_tools)
    return chat_to_lmi({"messages": MESSAGES, **body}, template), template


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "text"}, {}),
        ({"type": "json_object"}, {"guided_json_object": True}),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}},
         {"guided_json": SCHEMA}),
    ],
)
def test_response_format_on_chat_and_completions(fmt: dict[str, Any], expected: dict[str, Any]) -> None:
    req, _ = chat({"response_format": fmt})
    assert {k: v for k, v in req.parameters.items() if k.startswith("guided")} == expected
    comp = completion_to_lmi({"prompt": "p", "response_format": fmt})
    assert {k: v for k, v in comp.parameters.items() if k.startswith("guided")} == expected
    GenerationParameters.from_dict(req.parameters)  # valid LMI parameters


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "json_schema must be"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "cannot be combined"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice must be"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in tools"),
        ({"tools": [{"type": "code"}]}, r"tools\[0\] must be"),
        ({"tools": [WEATHER, WEATHER]}, "unique"),
        ({"tool_choice": "required"}, "needs tools"),
        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
         "cannot be combined"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_bad_openai_structured_fields(body: dict[str, Any], message: str) -> None:
    with pytest.raises((InvalidParameter, InvalidRequest), match=message):
        chat(body)


def test_required_and_named_tool_choice_become_a_schema() -> None:
    req, _ = chat({"tools": [WEATHER, TIME], "tool_choice": "required"})
    schema = req.parameters["guided_json"]
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 2
    names = [s["properties"]["name"]["enum"] for s in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    assert req.formatter == "chat_json" and req.tools is not None and req.tools.mode == "required"
    single, _ = chat({"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False})
    assert single.parameters["guided_json"]["type"] == "object"
    named, _ = chat({"tools": [WEATHER, TIME], "stream": True,
                     "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert named.parameters["guided_json"] == WEATHER["function"]["parameters"]
    assert named.formatter == "chat_tools_sse" and named.tools is not None and named.tools.function == "get_weather"
    GenerationParameters.from_dict(req.parameters)


def test_tools_reach_a_template_that_reads_them() -> None:
    _, template = chat({"tools": [WEATHER]}, reads_tools=True)
    messages, tools = template.calls[0]
    assert tools == [WEATHER] and messages == [{"role": "user", "content": "hi"}]
    _, template = chat({"tools": [WEATHER], "tool_choice": "none"}, reads_tools=True)
    assert template.calls[0][1] is None


def test_tools_become_a_system_message_otherwise() -> None:
    req, template = chat({"tools": [WEATHER], "tool_choice": "auto"})
    messages, tools = template.calls[0]
    assert tools is None and messages[0]["role"] == "system"
    assert "get_weather" in messages[0]["content"] and req.tools is not None and req.tools.mode == "auto"
    assert "guided_json" not in req.parameters


def test_tool_turns_are_accepted() -> None:
    turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    template = Template(reads_tools=True)
    chat_to_lmi({"messages": turns, "tools": [WEATHER]}, template)
    messages, _ = template.calls[0]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    plain = Template(reads_tools=False)
    chat_to_lmi({"messages": turns, "tools": [WEATHER]}, plain)
    texts = [m["content"] for m in plain.calls[0][0]]
    assert '"city": "Paris"' in texts[2] and "sunny" in texts[3]
    with pytest.raises(InvalidRequest, match="tool_call_id"):
        chat_to_lmi({"messages": [{"role": "tool", "content": "x"}]}, template)


# --------------------------------------------------------------------------- replies


def plan(mode: str, names: list[str], function: Optional[str] = None) -> ToolPlan:
    """A tool plan as the OpenAI parser makes it, for functions ``names``."""
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]
    return ToolPlan(tools, mode, function)


def reply(text: str, tools: ToolPlan, stream: bool = False, reason: str = "eos_token") -> str:
    from djl_handlers.dialects.registry import get_formatter
    from djl_handlers.request.records import Request, RequestOutput, Token

    request = Request(prompt="p", params=GenerationParameters(), tools=tools, response_options=ResponseOptions("m"))
    out = RequestOutput(request=request, prompt_tokens=3)
    out.tokens = [Token(1, text, -0.5)]
    out.new_tokens = list(out.tokens)
    out.finished, out.finish_reason = True, reason
    return get_formatter("chat_tools_sse" if stream else "chat_json", stream=stream)(out)


REQUIRED = plan("required", ["get_weather", "get_time"])


def test_tool_calls_in_a_json_reply() -> None:
    body = json.loads(reply('[{"name": "get_weather", "arguments": {"city": "Paris"}}]', REQUIRED))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    named = plan("named", ["get_weather"], "get_weather")
    body = json.loads(reply('{"city": "Rome"}', named))
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_auto_reply_is_text_unless_it_is_a_call() -> None:
    auto = plan("auto", ["get_weather", "get_time"])
    text = json.loads(reply("It is sunny.", auto))["choices"][0]
    assert text["message"]["content"] == "It is sunny." and text["finish_reason"] == "stop"
    block = json.loads(reply('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', auto))["choices"][0]
    assert block["finish_reason"] == "tool_calls"
    assert block["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    cut = json.loads(reply('[{"name": "get_weather", "argu', REQUIRED, reason="length"))["choices"][0]
    assert cut["finish_reason"] == "length" and cut["message"]["content"].startswith("[{")


def test_tool_calls_stream_as_openai_deltas() -> None:
    raw = reply('[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
                REQUIRED, stream=True)
    events = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
    assert raw.endswith("data: [DONE]\n\n")
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas[0] == {"role": "assistant", "content": ""}  # vLLM's first chunk
    firsts = [d["tool_calls"][0] for d in deltas[1:] if "id" in d.get("tool_calls", [{}])[0]]
    assert [(c["index"], c["function"]["name"], c["type"]) for c in firsts] == [
        (0, "get_weather", "function"), (1, "get_time", "function")]
    fragments = [d["tool_calls"][0] for d in deltas[1:] if d.get("tool_calls") and "id" not in d["tool_calls"][0]]
    assert all(set(f) == {"index", "function"} and set(f["function"]) == {"arguments"} for f in fragments)
    assert json.loads("".join(f["function"]["arguments"] for f in fragments if f["index"] == 0)) == {"city": "Paris"}
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_structured_output_describe() -> None:
    assert StructuredOutput("regex", "a", "guided_regex").describe() == "parameters.guided_regex"


def test_named_tool_call_streams_its_arguments_as_generated() -> None:
    from djl_handlers.dialects.registry import get_formatter
    from djl_handlers.request.records import Request, RequestOutput, Token

    named = plan("named", ["get_weather"], "get_weather")
    request = Request(prompt="p", params=GenerationParameters(), tools=named, response_options=ResponseOptions("m"))
    out = RequestOutput(request=request, prompt_tokens=3)
    fmt = get_formatter("chat_tools_sse", stream=True)
    frames = []
    for piece in ['{"city":', ' "Paris"', "}"]:
        token = Token(1, piece, -0.1)
        out.tokens.append(token)
        out.new_tokens = [token]
        if piece == "}":
            out.finished, out.finish_reason = True, "eos_token"
        frames.append(fmt(out))
    events = [json.loads(e[6:]) for f in frames for e in f.split("\n\n") if e.startswith("data: {")]
    first = events[0]["choices"][0]["delta"]["tool_calls"][0]
    assert first["function"] == {"name": "get_weather", "arguments": ""} and first["id"].startswith("call_")
    fragments = [e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for e in events[1:4]]
    assert json.loads("".join(fragments)) == {"city": "Paris"}
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert frames[-1].endswith("data: [DONE]\n\n") and "[DONE]" not in frames[0]
