"""LMI v0.27 formatters (json, jsonlines, sse, none): step behaviour and the seed's shapes."""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest

from djl_handlers.dialects.registry import get_formatter
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.request.records import Request, RequestOutput, Token

PROMPT = "What is Deep Learning?"


def make_output(details: bool = False, full_text: bool = False, prompt: str = PROMPT) -> RequestOutput:
    params = GenerationParameters(details=details, return_full_text=full_text)
    return RequestOutput(request=Request(prompt=prompt, params=params, inputs=prompt), prompt_tokens=5)


def step(
    out: RequestOutput, tokens: list[Token], finish: Optional[str] = None, error: Optional[str] = None
) -> RequestOutput:
    """Advance ``out`` by one scheduler step."""
    out.new_tokens = list(tokens)
    out.tokens.extend(tokens)
    if finish is not None:
        out.finished, out.finish_reason, out.error = True, finish, error
    return out


def drive(name: str, out: RequestOutput, steps: list[list[Token]], finish: str = "length") -> list[str]:
    fmt = get_formatter(name, stream=False)
    last = len(steps) - 1
    return [fmt(step(out, s, finish if i == last else None)) for i, s in enumerate(steps)]


TOKS = [Token(101, "Neural", -0.5), Token(102, " nets", -0.25), Token(103, " learn", -0.125)]


# --------------------------------------------------------------------------- json


def test_json_is_empty_until_finished_then_one_object() -> None:
    chunks = drive("json", make_output(), [[TOKS[0]], [TOKS[1]], [TOKS[2]]])
    assert chunks[:2] == ["", ""]
    assert chunks[2] == '{"generated_text": "Neural nets learn"}'


def test_json_seed_example_shape_with_details_and_key_order() -> None:
    body = "".join(drive("json", make_output(details=True), [[TOKS[0]], TOKS[1:]]))
    obj = json.loads(body)
    assert list(obj) == ["generated_text", "details"]
    assert list(obj["details"]) == ["finish_reason", "generated_tokens", "inputs", "tokens"]
    assert obj["details"]["generated_tokens"] == 3
    assert obj["details"]["inputs"] == PROMPT
    assert obj["details"]["tokens"][1] == {"id": [102], "text": " nets", "log_prob": -0.25}
    assert all(list(t) == ["id", "text", "log_prob"] for t in obj["details"]["tokens"])


def test_json_first_token_is_last_has_no_duplicated_text() -> None:
    body = "".join(drive("json", make_output(), [[TOKS[0]]]))
    assert json.loads(body) == {"generated_text": "Neural"}


def test_json_full_text_prefix_is_escaped() -> None:
    prompt = 'He said "go"\n\\'
    body = "".join(drive("json", make_output(full_text=True, prompt=prompt), [[TOKS[0]]]))
    assert json.loads(body)["generated_text"] == prompt + "Neural"
    assert '\\"go\\"\\n\\\\' in body


def test_json_keeps_non_ascii_unescaped() -> None:
    body = "".join(drive("json", make_output(), [[Token(1, "café ☕", -0.1)]]))
    assert "café ☕" in body and "\\u" not in body


def test_json_error_shape() -> None:
    out = make_output()
    fmt = get_formatter("json", stream=False)
    assert fmt(step(out, [TOKS[0]])) == ""
    out.error_code = 507
    obj = json.loads(fmt(step(out, [], finish="error", error="out of memory")))
    assert obj["generated_text"] is None
    assert (obj["error"], obj["code"]) == ("out of memory", 507)
    assert obj["details"]["finish_reason"] == "error"


def test_error_without_message_gets_one() -> None:
    out = step(make_output(), [], finish="error", error="")
    obj = json.loads(get_formatter("json", stream=False)(out))
    assert obj["error"] and obj["code"] == 424


def test_non_finite_log_prob_is_dropped() -> None:
    body = "".join(drive("json", make_output(details=True), [[Token(1, "x", float("-inf"))]]))
    assert json.loads(body)["details"]["tokens"] == [{"id": [1], "text": "x"}]


# --------------------------------------------------------------------------- jsonlines


def test_jsonlines_one_line_per_token_and_closing_line_seed_shape() -> None:
    chunks = drive("jsonlines", make_output(details=True), [[TOKS[0]], [], TOKS[1:]])
    assert chunks[1] == ""
    lines = "".join(chunks).splitlines()
    assert len(lines) == 3
    objs = [json.loads(line) for line in lines]
    assert objs[0] == {"token": {"id": [101], "text": "Neural", "log_prob": -0.5}}
    assert list(objs[1]) == ["token"]
    assert list(objs[2]) == ["token", "generated_text", "details"]
    assert objs[2]["generated_text"] == "Neural nets learn"
    assert objs[2]["details"] == {"finish_reason": "length", "generated_tokens": 3, "inputs": PROMPT}


def test_jsonlines_without_details_closes_with_generated_text_only() -> None:
    last = "".join(drive("jsonlines", make_output(), [TOKS])).splitlines()[-1]
    assert list(json.loads(last)) == ["token", "generated_text"]


def test_jsonlines_full_text_only_in_closing_line() -> None:
    lines = "".join(drive("jsonlines", make_output(full_text=True), [[TOKS[0]], [TOKS[1]]])).splitlines()
    assert json.loads(lines[0])["token"]["text"] == "Neural"
    assert json.loads(lines[1])["generated_text"] == PROMPT + "Neural nets"


def test_jsonlines_final_step_without_tokens_still_closes() -> None:
    out = make_output(details=True)
    body = "".join(drive("jsonlines", out, [[TOKS[0]], []], finish="stop_sequence"))
    closing = json.loads(body.splitlines()[-1])
    assert closing["token"] == {"id": [-1], "text": "", "special_token": True}
    assert closing["details"]["finish_reason"] == "stop_sequence"
    assert closing["details"]["generated_tokens"] == 1


def test_jsonlines_error_after_tokens_in_the_same_step() -> None:
    out = step(make_output(), TOKS[:2], finish="error", error="boom")
    lines = get_formatter("jsonlines", stream=True)(out).splitlines()
    assert len(lines) == 2
    closing = json.loads(lines[1])
    assert closing["token"]["text"] == " nets"
    assert (closing["error"], closing["code"], closing["details"]["finish_reason"]) == ("boom", 424, "error")
    assert closing["generated_text"] == "Neural nets"


# --------------------------------------------------------------------------- sse / none


def test_sse_wraps_each_jsonlines_line() -> None:
    steps = [[TOKS[0]], TOKS[1:]]
    lines = "".join(drive("jsonlines", make_output(details=True), steps)).splitlines()
    events = "".join(drive("sse", make_output(details=True), steps))
    assert events == "".join(f"data: {line}\n\n" for line in lines)


def test_none_is_raw_text_per_step() -> None:
    assert drive("none", make_output(full_text=True), [[TOKS[0]], [], TOKS[1:]]) == [
        "Neural",
        "",
        " nets learn",
    ]


@pytest.mark.parametrize(
    ("name", "content_type"),
    [
        ("json", "application/json"),
        ("jsonlines", "application/jsonlines"),
        ("sse", "text/event-stream"),
        ("none", "text/plain"),
    ],
)
def test_content_types(name: str, content_type: str) -> None:
    fmt = get_formatter(name, stream=False)
    assert (fmt.name, fmt.content_type) == (name, content_type)


def test_token_special_flag_and_zero_log_prob() -> None:
    out = step(make_output(), [Token(2, "</s>", 0.0, special=True)], finish="eos_token")
    obj: dict[str, Any] = json.loads(get_formatter("jsonlines", stream=True)(out))
    assert obj["token"] == {"id": [2], "text": "</s>", "log_prob": 0.0, "special_token": True}
