"""Structured output and tool calling over HTTP: ``djl-handlers serve`` with the embedded SmolLM2
(fp32, greedy) in one rolling batch. Every ``guided_json`` output must validate against its schema
(jsonschema), every ``guided_regex`` output must match, every ``guided_choice`` output must be a
choice; the ``openai`` client must get parseable ``tool_calls``; bad constraints get a 400 that
names the problem.

The schemas bound what a small model could otherwise extend forever (``maxLength``, ``maxItems``,
integer ranges, enums): the grammar forces the closing quotes and brackets, and the row ends with
eos as soon as the JSON is complete; ``max_new_tokens`` is only a safety net.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_server_harness import ROOT, ServerProcess

pytestmark = pytest.mark.slow
jsonschema = pytest.importorskip("jsonschema")

S = {"type": "string", "maxLength": 12}
SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("Describe a person.", {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0,
                                                                               "maximum": 120}},
                            "required": ["name", "age"]}),
    ("Is water wet?", {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}),
    ("Pick a color.", {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                       "required": ["color"]}),
    ("List three fruits.", {"type": "object", "properties": {"fruits": {"type": "array", "items": S, "minItems": 1,
                                                                        "maxItems": 3}}, "required": ["fruits"]}),
    ("A city and its country.", {"type": "object", "properties": {"city": S, "country": S},
                                 "required": ["city", "country"]}),
    ("Rate this movie from 1 to 5.", {"type": "object", "properties": {
        "stars": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["stars"]}),
    ("A book.", {"type": "object", "properties": {
        "title": S, "year": {"type": "integer", "minimum": 1000, "maximum": 2100}}, "required": ["title", "year"]}),
    ("A point.", {"type": "object", "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99},
                                                   "y": {"type": "integer", "minimum": -99, "maximum": 99}},
                  "required": ["x", "y"]}),
    ("An address.", {"type": "object", "properties": {"street": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                     "required": ["street", "zip"]}),
    ("A user.", {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {
        "type": "integer", "minimum": 1, "maximum": 9999}, "admin": {"type": "boolean"}}, "required": ["id", "admin"]}},
                 "required": ["user"]}),
    ("Weather today.", {"type": "object", "properties": {"sky": {"enum": ["sunny", "cloudy", "rain"]},
                                                         "temp_c": {"type": "integer", "minimum": -40, "maximum": 50}},
                        "required": ["sky", "temp_c"]}),
    ("Two tags.", {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 2}),
    ("A yes or no answer.", {"enum": ["yes", "no"]}),
    ("An integer.", {"type": "integer", "minimum": 0, "maximum": 1000}),
    ("A short word.", {"type": "string", "maxLength": 8}),
    ("A pet.", {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "name": S, "age": {
        "type": "integer", "minimum": 0, "maximum": 30}}, "required": ["kind", "name"]}),
    ("A task.", {"type": "object", "properties": {"title": S, "done": {"type": "boolean"}, "priority": {
        "enum": ["low", "high"]}}, "required": ["title", "done", "priority"]}),
    ("A nullable note.", {"type": "object", "properties": {"note": {"anyOf": [S, {"type": "null"}]}},
                          "required": ["note"]}),
    ("A matrix.", {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                         "maximum": 9}, "minItems": 2, "maxItems": 2},
                   "minItems": 2, "maxItems": 2}),
    ("A product.", {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                                                     "stock": {"type": "integer", "minimum": 0, "maximum": 500}},
                    "required": ["sku", "stock"]}),
    ("An event.", {"type": "object", "properties": {"name": S, "attendees": {"type": "array", "items": S,
                                                                              "maxItems": 2}}, "required": ["name"]}),
    ("A contact.", {"type": "object", "properties": {
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
        "phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}}, "required": ["email", "phone"]}),
]
REGEXES = [("Give a phone number.", r"[0-9]{3}-[0-9]{3}-[0-9]{4}"), ("A date:", r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"),
           ("Hex color:", r"#[0-9a-f]{6}")]
CHOICES = [("Is Paris in France?", ["yes", "no"]), ("Best season?", ["spring", "summer", "autumn", "winter"])]
FREE = ["What is the capital of France?", "Count to five.", "Name a planet."]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 20}},
                   "required": ["timezone"]}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("structured") / "server.log"
    proc = ServerProcess(ROOT / "serving.properties.examples" / "hf-rolling-batch", Path(log))
    yield proc
    proc.stop()


def chat_prompt(question: str) -> str:
    return f"<|im_start|>user\n{question} Answer in JSON.<|im_end|>\n<|im_start|>assistant\n"


def post(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=600) as http:
        return http.post("/invocations", json=body)


def test_every_output_follows_its_constraint_in_one_rolling_batch(server: ServerProcess) -> None:
    jobs: list[tuple[str, Any, dict[str, Any]]] = [("json", s, {"guided_json": s, "_q": q}) for q, s in SCHEMAS]
    jobs += [("regex", pattern, {"guided_regex": pattern, "_q": q}) for q, pattern in REGEXES]
    jobs += [("choice", choices, {"guided_choice": choices, "_q": q}) for q, choices in CHOICES]
    jobs += [("free", None, {"_q": q}) for q in FREE]
    assert len(SCHEMAS) >= 20

    def call(job: tuple[str, Any, dict[str, Any]]) -> dict[str, Any]:
        params = dict(job[2])
        question = params.pop("_q")
        res = post(server, {"inputs": chat_prompt(question),
                            "parameters": {"max_new_tokens": 96, "details": True, **params}})
        assert res.status_code == 200, res.text
        return dict(res.json())

    with ThreadPoolExecutor(len(jobs)) as pool:  # all in flight together: one rolling batch
        results = list(pool.map(call, jobs))
    for (kind, constraint, _), body in zip(jobs, results, strict=True):
        text = body["generated_text"]
        if kind == "json":
            jsonschema.validate(json.loads(text), constraint)
        elif kind == "regex":
            assert re.fullmatch(constraint, text), (constraint, text)
        elif kind == "choice":
            assert text in constraint
        else:
            assert text and body["details"]["finish_reason"] in ("eos_token", "length")
            continue
        assert body["details"]["finish_reason"] == "eos_token", (kind, text)  # complete grammar: the row ends


def test_free_greedy_output_unchanged_by_constrained_neighbours(server: ServerProcess) -> None:
    body = {"inputs": chat_prompt(FREE[0]), "parameters": {"max_new_tokens": 20}}
    alone = post(server, body).json()["generated_text"]
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(post, server, {"inputs": chat_prompt(q), "parameters": {"max_new_tokens": 40,
                                                                                      "guided_json": s}})
                   for q, s in SCHEMAS[:3]]
        mixed = pool.submit(post, server, body)
        assert mixed.result().json()["generated_text"] == alone
        assert all(f.result().status_code == 200 for f in futures)


def test_tgi_grammar_and_openai_response_format(server: ServerProcess) -> None:
    from openai import OpenAI

    with httpx.Client(base_url=server.url, timeout=600) as http:
        res = http.post("/generate", json={"inputs": chat_prompt("A year."), "parameters": {
            "max_new_tokens": 10, "grammar": {"type": "regex", "value": "(19|20)[0-9]{2}"}}})
    assert res.status_code == 200, res.text
    assert re.fullmatch("(19|20)[0-9]{2}", res.json()[0]["generated_text"])
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    schema = SCHEMAS[0][1]
    out = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Describe a person."}], max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)
    assert out.choices[0].finish_reason == "stop"
    # json_object bounds nothing: a prompt that asks for a small object (unbounded strings may hit max_tokens)
    ask = [{"role": "user", "content": 'Reply with the JSON object {"a": 1}.'}]
    obj = client.chat.completions.create(model="m", messages=ask, max_tokens=40, temperature=0,
                                         response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    comp = client.completions.create(model="m", prompt=chat_prompt("Is the sky blue?"), max_tokens=10, temperature=0,
                                     extra_body={"guided_choice": ["yes", "no"]})
    assert comp.choices[0].text in ("yes", "no")


def test_openai_tool_choice_required_gives_parseable_tool_calls(server: ServerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    res = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER, TIME],  # type: ignore[list-item]
                                         tool_choice="required", max_tokens=120, temperature=0)
    choice = res.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.id and call.type == "function"
        fn = call.function  # type: ignore[union-attr]
        tool = WEATHER if fn.name == "get_weather" else TIME
        assert fn.name in ("get_weather", "get_time")
        jsonschema.validate(json.loads(fn.arguments), tool["function"]["parameters"])  # type: ignore[index]
    # the next turn: the assistant's call and the tool's result are accepted
    first = choice.message.tool_calls[0]
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": first.id, "content": '{"sky": "sunny", "temp_c": 21}'}]
    follow = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER, TIME],  # type: ignore[list-item]
                                            max_tokens=30, temperature=0)
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_openai_named_tool_call_streams(server: ServerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "What time is it in Tokyo?"}], tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=60, temperature=0, stream=True)
    names, args, reasons = [], "", []
    for chunk in stream:
        delta = chunk.choices[0].delta
        for call in delta.tool_calls or []:
            if call.function and call.function.name:
                names.append(call.function.name)
            args += (call.function.arguments or "") if call.function else ""
        reasons.append(chunk.choices[0].finish_reason)
    assert names == ["get_time"] and reasons[-1] == "tool_calls"
    jsonschema.validate(json.loads(args), TIME["function"]["parameters"])  # type: ignore[index]


@pytest.mark.parametrize(
    ("parameters", "needle"),
    [
        ({"guided_json": {"type": "objectx"}}, '"objectx" is not a JSON Schema type'),
        ({"guided_json": "{not json"}, "guided_json is not valid JSON"),
        ({"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/defs/missing"}}}},
         "guided_json is not a valid JSON schema"),
        ({"guided_regex": "(unclosed"}, "guided_regex is not a valid regular expression"),
        ({"guided_grammar": "root ::= undefined_rule"}, "guided_grammar is not a valid EBNF grammar"),
        ({"guided_choice": []}, "guided_choice must be a non-empty list"),
    ],
)
def test_bad_constraints_are_a_400_naming_the_problem(server: ServerProcess, parameters: dict[str, Any],
                                                      needle: str) -> None:
    res = post(server, {"inputs": "x", "parameters": {"max_new_tokens": 5, **parameters}})
    assert res.status_code == 400, res.text
    assert needle in res.json()["error"]


def test_openai_client_sees_the_400(server: ServerProcess) -> None:
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(BadRequestError, match="not a JSON Schema type"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "bad", "schema": {"type": "strng"}}})
