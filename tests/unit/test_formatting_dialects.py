"""TGI, OpenAI, Bedrock-style (3p) and dynamic-batch formats: shapes, key order, stream framing."""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest

from djl_handlers.dialects.openai.state import OpenAIState
from djl_handlers.dialects.registry import get_formatter
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.request.records import Request, RequestOutput, ResponseOptions, Token

TOKS = [Token(10, "Bon", -0.5), Token(11, "jour", -0.25), Token(12, " !", -0.125)]


def make_output(
    details: bool = False,
    extra: Optional[dict[str, Any]] = None,
    request_seed: Optional[int] = None,
    **params: Any,
) -> RequestOutput:
    """``extra``: a response id and creation time fixed in advance (``id``, ``created``) and the
    client's ``ResponseOptions`` fields."""
    gen = GenerationParameters(details=details, **params)
    fields = dict(extra or {})
    state = OpenAIState(response_id=fields.pop("id", None), created=fields.pop("created", None))
    request = Request(prompt="Say hi: ", params=gen, inputs="Say hi: ", seed=request_seed,
                      response_options=ResponseOptions(**fields), formatter_state=state)
    return RequestOutput(request=request, prompt_tokens=3)


def body_of(name: str, out: RequestOutput, steps: list[list[Token]], finish: str = "eos_token") -> str:
    fmt = get_formatter(name, stream=True)
    chunks = []
    for i, tokens in enumerate(steps):
        out.new_tokens = list(tokens)
        out.tokens.extend(tokens)
        if i == len(steps) - 1:
            out.finished, out.finish_reason = True, finish
        chunks.append(fmt(out))
    return "".join(chunks)


def sse_payloads(body: str, prefix: str = "data: ") -> list[str]:
    assert body.endswith("\n\n")
    events = body[:-2].split("\n\n")
    assert all(e.startswith(prefix) and "\n" not in e for e in events)
    return [e[len(prefix) :] for e in events]


# --------------------------------------------------------------------------- TGI


def test_tgi_non_stream_is_list_wrapped_with_tgi_details() -> None:
    out = make_output(details=True, do_sample=True)
    out.request.seed = 1234
    obj = json.loads(body_of("tgi", out, [TOKS[:1], TOKS[1:]], finish="length"))
    assert isinstance(obj, list) and len(obj) == 1
    assert list(obj[0]) == ["generated_text", "details"]
    details = obj[0]["details"]
    assert list(details) == ["finish_reason", "generated_tokens", "seed", "prefill", "tokens"]
    assert details["seed"] == 1234 and details["prefill"] == []
    assert details["tokens"][0] == {"id": 10, "text": "Bon", "logprob": -0.5, "special": False}


def test_tgi_seed_is_the_resolved_seed_and_null_when_greedy() -> None:
    out = make_output(details=True, seed=7, do_sample=True, request_seed=7)
    assert json.loads(body_of("tgi", out, [TOKS]))[0]["details"]["seed"] == 7
    greedy = make_output(details=True, seed=7)  # a client seed does not make greedy decoding seeded
    greedy.request.seed = 99
    assert json.loads(body_of("tgi", greedy, [TOKS]))[0]["details"]["seed"] is None
    zero = make_output(details=True, do_sample=True, temperature=0.0, request_seed=5)
    assert json.loads(body_of("tgi", zero, [TOKS]))[0]["details"]["seed"] is None


def test_tgi_stream_events_index_and_closing_fields() -> None:
    body = body_of("tgi_stream", make_output(details=True), [TOKS[:1], [], TOKS[1:]])
    events = [json.loads(p) for p in sse_payloads(body, prefix="data:")]
    assert [e["index"] for e in events] == [1, 2, 3]
    assert all(list(e) == ["index", "token", "generated_text", "details"] for e in events)
    assert [e["generated_text"] for e in events] == [None, None, "Bonjour !"]
    assert events[2]["details"] == {
        "finish_reason": "eos_token",
        "generated_tokens": 3,
        "seed": None,
        "input_length": 3,
    }
    assert events[0]["details"] is None


def test_tgi_stream_without_details_has_null_details() -> None:
    events = sse_payloads(body_of("tgi_stream", make_output(), [TOKS]), prefix="data:")
    assert json.loads(events[-1])["details"] is None


# --------------------------------------------------------------------------- OpenAI

EXTRA = {"id": "chatcmpl-7", "created": 1700000001, "model": "tiny"}


def test_chat_json_shape() -> None:
    obj = json.loads(body_of("chat_json", make_output(extra=EXTRA), [TOKS[:2], TOKS[2:]], finish="length"))
    assert list(obj) == ["id", "object", "created", "model", "choices", "usage"]
    assert (obj["id"], obj["object"], obj["created"], obj["model"]) == (
        "chatcmpl-7",
        "chat.completion",
        1700000001,
        "tiny",
    )
    choice = obj["choices"][0]
    assert choice == {
        "index": 0,
        "message": {"role": "assistant", "content": "Bonjour !"},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert obj["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


@pytest.mark.parametrize(("lmi", "openai"), [("eos_token", "stop"), ("stop_sequence", "stop"), ("length", "length")])
def test_openai_finish_reason_mapping(lmi: str, openai: str) -> None:
    obj = json.loads(body_of("completion_json", make_output(extra=EXTRA), [TOKS], finish=lmi))
    assert obj["choices"][0]["finish_reason"] == openai


def test_chat_sse_chunks_role_first_then_done() -> None:
    body = body_of("chat_sse", make_output(extra=EXTRA), [TOKS[:1], TOKS[1:]])
    payloads = sse_payloads(body)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert len(chunks) == 3
    assert {c["id"] for c in chunks} == {"chatcmpl-7"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Bon"}
    assert chunks[1]["choices"][0]["delta"] == {"content": "jour"}
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "stop"]
    assert all("usage" not in c for c in chunks)


def test_done_only_after_the_last_chunk() -> None:
    fmt = get_formatter("chat_sse", stream=True)
    out = make_output(extra=EXTRA)
    out.new_tokens = TOKS[:1]
    out.tokens.extend(TOKS[:1])
    assert "[DONE]" not in fmt(out)


def test_include_usage_adds_null_usage_and_a_usage_chunk() -> None:
    extra = {**EXTRA, "include_usage": True}
    payloads = sse_payloads(body_of("completion_sse", make_output(extra=extra), [TOKS]))
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


def test_missing_id_and_created_are_made_once_and_reused() -> None:
    out = make_output()
    payloads = sse_payloads(body_of("chat_sse", out, [TOKS[:1], TOKS[1:]]))
    ids = {json.loads(p)["id"] for p in payloads[:-1]}
    created = {json.loads(p)["created"] for p in payloads[:-1]}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    assert len(created) == 1 and isinstance(next(iter(created)), int)
    assert isinstance(out.request.formatter_state, OpenAIState)
    assert out.request.formatter_state.response_id in ids
    completion = make_output()
    assert json.loads(body_of("completion_json", completion, [TOKS]))["id"].startswith("cmpl-")


def test_chat_logprobs_use_utf8_bytes() -> None:
    extra = {**EXTRA, "logprobs": True}
    obj = json.loads(body_of("chat_json", make_output(extra=extra), [[Token(1, "é", -0.5)]]))
    entry = obj["choices"][0]["logprobs"]["content"][0]
    assert entry == {"token": "é", "logprob": -0.5, "bytes": [0xC3, 0xA9], "top_logprobs": []}


def test_completion_logprobs_and_echo_offsets() -> None:
    extra = {**EXTRA, "logprobs": 1, "echo": True}
    out = make_output(extra=extra, return_full_text=True, decoder_input_details=True)
    out.prefill = [Token(1, "Say", None), Token(2, " hi:", -2.0), Token(3, " ", float("-inf"))]
    out.prompt_top_tokens = [None, [Token(4, " yo", -1.0)], [Token(5, "\n", -0.1)]]
    out.top_tokens = [[Token(10, "Bon", -0.5)], [Token(13, "soir", -0.2)], [Token(12, " !", -0.125)]]
    obj = json.loads(body_of("completion_json", out, [TOKS]))
    choice = obj["choices"][0]
    assert choice["text"] == "Say hi: Bonjour !"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["Say", " hi:", " ", "Bon", "jour", " !"]
    assert lp["text_offset"] == [0, 3, 7, 8, 11, 15]
    assert lp["token_logprobs"] == [None, -2.0, -9999.0, -0.5, -0.25, -0.125]
    assert lp["top_logprobs"][0] is None
    assert lp["top_logprobs"][1] == {" hi:": -2.0, " yo": -1.0}  # the chosen one and the top one
    assert lp["top_logprobs"][3] == {"Bon": -0.5}  # the chosen one is the top one
    assert lp["top_logprobs"][4] == {"jour": -0.25, "soir": -0.2}


def test_completion_echo_without_tokens_shows_the_prompt_alone() -> None:
    out = make_output(extra={**EXTRA, "logprobs": 0, "echo": True, "prompt_only": True}, return_full_text=True)
    out.prefill = [Token(1, "Say", None), Token(2, " hi: ", -2.0)]
    choice = json.loads(body_of("completion_json", out, [TOKS[:1]], finish="length"))["choices"][0]
    assert choice["text"] == "Say hi: " and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["Say", " hi: "]
    assert choice["logprobs"]["top_logprobs"] == [None, {" hi: ": -2.0}]


def test_openai_error_names_the_refused_field_as_param() -> None:
    from djl_handlers.errors import InvalidParameter
    from djl_handlers.scheduling.rolling import error_slot

    exc = InvalidParameter("logprobs must be an integer in [0, 20], got 50", field="logprobs")
    slot = error_slot(exc, make_output(extra=EXTRA).request, get_formatter("completion_json", stream=False))
    record = slot.record()
    assert record["code"] == 400
    assert json.loads(record["data"])["error"] == {"message": exc.message, "type": "invalid_request_error",
                                                   "param": "logprobs", "code": 400}


def test_openai_error_non_stream_and_stream() -> None:
    out = make_output(extra=EXTRA)
    out.finished, out.finish_reason, out.error, out.error_code = True, "error", "bad prompt", 400
    assert json.loads(get_formatter("chat_json", stream=False)(out)) == {
        "error": {"message": "bad prompt", "type": "invalid_request_error", "param": None, "code": 400}
    }
    payloads = sse_payloads(get_formatter("chat_sse", stream=True)(out))
    assert payloads[-1] == "[DONE]" and json.loads(payloads[0])["error"]["code"] == 400


def test_v027_chat_names_use_spaced_json_and_jsonlines() -> None:
    lines = body_of("jsonlines_chat", make_output(extra=EXTRA), [TOKS]).splitlines()
    assert len(lines) == 3 and all(line.startswith('{"id": "chatcmpl-7", ') for line in lines)
    assert "[DONE]" not in "".join(lines)


# --------------------------------------------------------------------------- 3p


def test_3p_non_stream_shape() -> None:
    obj = json.loads(body_of("3p", make_output(), [TOKS], finish="length"))
    assert obj == {
        "body": {
            "generation": "Bonjour !",
            "prompt_token_count": 3,
            "generation_token_count": 3,
            "stop_reason": "length",
        },
        "metering": {"inputTokenCount": 3, "outputTokenCount": 3},
        "content_type": "application/json",
    }


def test_3p_stream_counts_and_first_line_metering() -> None:
    lines = [json.loads(x) for x in body_of("3p_stream", make_output(), [TOKS[:2], TOKS[2:]]).splitlines()]
    assert [line["body"]["generation_token_count"] for line in lines] == [1, 2, 3]
    assert [line["body"]["prompt_token_count"] for line in lines] == [3, None, None]
    assert list(lines[0]["metering"]) == ["outputTokenCount", "inputTokenCount"]
    assert [line["body"]["stop_reason"] for line in lines] == [None, None, "eos_token"]


def test_3p_error_shape() -> None:
    out = make_output()
    out.finished, out.finish_reason, out.error = True, "error", "engine died"
    obj = json.loads(get_formatter("3p", stream=False)(out))
    assert obj["body"]["generation"] is None and obj["body"]["stop_reason"] == "error"
    assert obj["error"] == {"error_code": 424, "error_msg": "engine died"}


# --------------------------------------------------------------------------- dynamic batch


