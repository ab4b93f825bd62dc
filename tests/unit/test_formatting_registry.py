"""Formatter resolution, content types, errors, and custom (new and legacy) formatters."""

from __future__ import annotations

import json
from typing import Any

import pytest

from djl_handlers.dialects.registry import allowed_names, content_type_for, get_formatter
from djl_handlers.errors import ConfigError, InvalidRequest
from djl_handlers.formatting import is_legacy_formatter
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.request.records import Request, RequestOutput, Token


def make_output(details: bool = False) -> RequestOutput:
    params = GenerationParameters(details=details, return_full_text=True)
    request = Request(prompt="Hi: ", params=params, inputs="Hi: ", legacy_id=7)
    return RequestOutput(request=request, prompt_tokens=2)


def step(out: RequestOutput, tokens: list[Token], finish: str | None = None) -> RequestOutput:
    out.new_tokens = list(tokens)
    out.tokens.extend(tokens)
    if finish:
        out.finished, out.finish_reason = True, finish
    return out


@pytest.mark.parametrize(
    ("spec", "stream", "tgi", "name"),
    [
        (None, False, False, "json"),
        (None, True, False, "jsonlines"),
        ("", True, False, "jsonlines"),
        (None, False, True, "tgi"),
        (None, True, True, "tgi_stream"),
        ("json", True, False, "json"),
        ("jsonlines", False, False, "jsonlines"),
        (" JSONLines ", False, False, "jsonlines"),
        ("json", False, True, "tgi"),
        ("sse", True, True, "tgi_stream"),
        ("sse", True, False, "sse"),
        ("jsonlines", True, True, "jsonlines"),
        ("3p", False, False, "3p"),
        ("json_chat", False, False, "json_chat"),
        ("sse_chat", True, False, "sse_chat"),
    ],
)
def test_resolution(spec: str | None, stream: bool, tgi: bool, name: str) -> None:
    fmt = get_formatter(spec, stream=stream, tgi_compat=tgi)
    assert fmt.name == name
    assert content_type_for(spec, stream, tgi) == fmt.content_type


@pytest.mark.parametrize("name", allowed_names())
def test_every_name_builds_and_declares_its_content_type(name: str) -> None:
    fmt = get_formatter(name, stream=False)
    assert fmt.name == name
    assert fmt.content_type == content_type_for(name, False)
    assert fmt.content_type in {
        "application/json",
        "application/jsonlines",
        "text/event-stream",
        "text/plain",
    }


def test_unknown_name_is_a_request_error_naming_value_and_choices() -> None:
    with pytest.raises(InvalidRequest) as info:
        get_formatter("yaml", stream=False)
    assert "'yaml'" in info.value.message and "jsonlines" in info.value.message
    assert info.value.field == "output_formatter"


def test_unknown_name_from_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="xml"):
        get_formatter("xml", stream=True, config=True)
    with pytest.raises(ConfigError):
        content_type_for("xml", True, config=True)


def test_non_string_spec_is_rejected() -> None:
    with pytest.raises(InvalidRequest, match="int"):
        get_formatter(3, stream=False)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- custom formatters


def test_custom_new_style_called_once_per_step() -> None:
    calls: list[int] = []

    def fmt(out: RequestOutput) -> str:
        calls.append(len(out.new_tokens))
        return "|".join(t.text for t in out.new_tokens) + ("<end>" if out.finished else "")

    wrapped = get_formatter(fmt, stream=True)
    out = make_output()
    text = wrapped(step(out, [Token(1, "a"), Token(2, "b")])) + wrapped(step(out, [], finish="length"))
    assert calls == [2, 0]
    assert text == "a|b<end>"
    assert wrapped.name == "fmt"
    assert wrapped.content_type == "application/jsonlines"
    assert get_formatter(fmt, stream=False).content_type == "application/json"


def test_custom_content_type_attribute_wins() -> None:
    def fmt(out: RequestOutput) -> str:
        return ""

    fmt.content_type = "text/csv"  # type: ignore[attr-defined]
    assert get_formatter(fmt, stream=False).content_type == "text/csv"
    assert content_type_for(fmt, True) == "text/csv"


def test_custom_result_coercion() -> None:
    out = step(make_output(), [Token(1, "a")])
    assert get_formatter(lambda o: None, stream=False)(out) == ""
    assert get_formatter(lambda o: "é".encode(), stream=False)(out) == "é"
    with pytest.raises(ConfigError, match="must return str"):
        get_formatter(lambda o: 5, stream=False)(out)


def legacy_fmt(token: Any, first_token: bool, last_token: bool, details: dict, generated_text: str, id: int) -> str:
    record = {"id": token.id, "text": token.text, "first": first_token, "request": id}
    if last_token:
        record.update(finish=details.get("finish_reason"), text_all=generated_text, n=details.get("generated_tokens"))
    return json.dumps(record) + "\n"


def test_legacy_signature_detection() -> None:
    assert is_legacy_formatter(legacy_fmt)
    assert not is_legacy_formatter(lambda out: "")

    def annotated(token: Token, first: bool) -> str:
        return ""

    def with_defaults(out: Any, a: int = 1, b: int = 2, c: int = 3, d: int = 4, e: int = 5) -> str:
        return ""

    assert is_legacy_formatter(annotated)
    assert not is_legacy_formatter(with_defaults)
    assert not is_legacy_formatter(print)


def test_legacy_formatter_called_per_token_with_v027_arguments() -> None:
    wrapped = get_formatter(legacy_fmt, stream=True)
    out = make_output(details=True)
    body = wrapped(step(out, [Token(5, "a", -0.1)])) + wrapped(step(out, [Token(6, "b"), Token(7, "c")], "length"))
    lines = [json.loads(line) for line in body.splitlines()]
    assert [(r["id"], r["first"], r["request"]) for r in lines] == [
        ([5], True, 7),
        ([6], False, 7),
        ([7], False, 7),
    ]
    assert lines[-1]["finish"] == "length"
    assert lines[-1]["text_all"] == "Hi: abc"
    assert lines[-1]["n"] == 3


def test_legacy_details_dict_matches_v027_keys() -> None:
    seen: list[dict] = []

    def fmt(token: Any, first: bool, last: bool, details: dict, text: str, id: int) -> str:
        seen.append(details)
        return token.text

    out = make_output(details=True)
    assert get_formatter(fmt, stream=False)(step(out, [Token(1, "x", -0.5)], "eos_token")) == "x"
    assert list(seen[0]) == [
        "finish_reason",
        "tokens",
        "generated_tokens",
        "inputs",
        "parameters",
        "prompt_tokens",
    ]
    assert seen[0]["tokens"] == [{"id": [1], "text": "x", "log_prob": -0.5}]
    assert seen[0]["parameters"]["details"] is True
    assert seen[0]["prompt_tokens"] == 2


def test_legacy_formatter_gets_closing_call_on_empty_final_step() -> None:
    wrapped = get_formatter(legacy_fmt, stream=True)
    out = make_output()
    wrapped(step(out, [Token(5, "a")]))
    last = json.loads(wrapped(step(out, [], "stop_sequence")))
    assert (last["id"], last["text"], last["text_all"]) == ([-1], "", "Hi: a")
