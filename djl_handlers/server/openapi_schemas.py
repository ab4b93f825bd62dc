"""The response shapes of every route, as JSON Schemas for ``/openapi.json`` (component schemas).

Request schemas are not written here: :mod:`.openapi` builds them from the tables the parsers
validate with. These response shapes follow the formatters (``formatting``, ``dialects``) and the
front end's own bodies; ``tests/unit/test_openapi.py`` checks every golden response file
(``tests/golden/formatting``) against them, so a formatter that changes its shape fails there.
"""

from __future__ import annotations

from typing import Any

__all__ = ["component_schemas", "ref"]

_STR, _INT, _NUM, _BOOL, _OBJ = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}, {
    "type": "object"}


def ref(name: str) -> dict[str, str]:
    """A ``$ref`` to component schema ``name``."""
    return {"$ref": f"#/components/schemas/{name}"}


def _null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}, **extra}


def _lmi() -> dict[str, Any]:
    token = _obj({"text": _STR}, {"id": {"anyOf": [_INT, {"type": "array", "items": _INT}]}, "log_prob": _null(_NUM),
                                  "special_token": _BOOL})
    details = _obj({"finish_reason": _null(_STR)}, {"generated_tokens": _INT, "inputs": {}, "tokens": {
        "type": "array", "items": ref("LmiToken")}})
    failure = {"error": _STR, "code": _INT}
    result = _obj({"generated_text": _null(_STR)}, {"details": ref("LmiDetails"), **failure})
    line = _obj({}, {"token": ref("LmiToken"), "generated_text": _null(_STR), "details": ref("LmiDetails"), **failure})
    three_p_body = _obj({"generation": _null(_STR), "generation_token_count": _INT},
                        {"prompt_token_count": _null(_INT), "stop_reason": _null(_STR)})
    three_p = _obj({"body": three_p_body, "metering": _OBJ, "content_type": _STR}, {"error": _obj(
        {"error_code": _INT, "error_msg": _STR})})
    return {
        "LmiToken": token, "LmiDetails": details, "LmiResult": result,
        "LmiResults": {"type": "array", "items": ref("LmiResult")},  # dynamic batch, TGI-style list
        "LmiStreamLine": line,
        "LmiOutputsLine": _obj({"outputs": {"type": "array"}}),  # dynamic batch with streaming
        "ThreePResult": three_p,
    }


def _openai() -> dict[str, Any]:
    usage = _obj({"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT},
                 {"completion_tokens_details": _obj({}, {"reasoning_tokens": _INT})})  # with a reasoning parser
    envelope = {"id": _STR, "created": _INT, "model": _STR}
    message = _obj({"role": _STR}, {"content": _null(_STR), "tool_calls": {"type": "array"},
                                     "reasoning_content": _null(_STR), "reasoning": _null(_STR)})  # docs/chat.md
    chat_choice = _obj({"index": _INT, "message": message, "finish_reason": _null(_STR)}, {"logprobs": _null(_OBJ)})
    delta_choice = _obj({"index": _INT, "delta": _OBJ}, {"finish_reason": _null(_STR), "logprobs": _null(_OBJ)})
    text_choice = _obj({"index": _INT, "text": _STR}, {"finish_reason": _null(_STR), "logprobs": _null(_OBJ)})
    choices = {"type": "array", "items": None}

    def completion(kind: str, choice: dict[str, Any]) -> dict[str, Any]:
        return _obj({**envelope, "object": {"const": kind}, "choices": {**choices, "items": choice}},
                    {"usage": _null(ref("OpenAIUsage"))})

    error = _obj({"message": _STR, "type": _STR, "code": {"anyOf": [_INT, _STR, {"type": "null"}]}},
                 {"param": _null(_STR)})
    model = _obj({"id": _STR, "object": {"const": "model"}, "created": _INT, "owned_by": _STR},
                 {"root": _null(_STR), "parent": _null(_STR), "max_model_len": _null(_INT)})
    return {
        "OpenAIUsage": usage,
        "ChatCompletion": completion("chat.completion", chat_choice),
        "ChatCompletionChunk": completion("chat.completion.chunk", delta_choice),
        "Completion": completion("text_completion", text_choice),
        "OpenAIError": _obj({"error": error}),
        "ModelList": _obj({"object": {"const": "list"}, "data": {"type": "array", "items": model}}),
        "TokenizeResult": _obj({"count": _INT, "max_model_len": _INT, "tokens": {"type": "array", "items": _INT}},
                               {"token_strs": {"type": "array", "items": _STR}}),
        "DetokenizeResult": _obj({"prompt": _STR}),
    }


def _tgi() -> dict[str, Any]:
    token = _obj({"id": _INT, "text": _STR}, {"logprob": _null(_NUM), "special": _BOOL})
    result = _obj({"generated_text": _STR}, {"details": _null(_OBJ)})
    event = _obj({"token": ref("TgiToken")}, {"index": _INT, "generated_text": _null(_STR), "details": _null(_OBJ),
                                              "top_tokens": {"type": "array"}})
    span = _obj({"id": _INT, "text": _STR, "start": _INT, "stop": _INT})
    info = _obj({"model_id": _null(_STR), "max_input_tokens": _null(_INT), "max_total_tokens": _null(_INT),
                 "version": _STR}, {"model_dtype": _null(_STR), "model_device_type": _null(_STR)})
    return {
        "TgiToken": token, "TgiResults": {"type": "array", "items": result}, "TgiStreamEvent": event,
        "TgiError": _obj({"error": _STR, "error_type": _STR}),
        "TgiTokens": {"type": "array", "items": span}, "TgiInfo": info,
    }


def _djl() -> dict[str, Any]:
    status = _obj({"status": _STR})
    adapter = _obj({"name": _STR, "src": _STR, "preload": _BOOL, "pin": _BOOL})
    return {
        "DjlError": _obj({"code": _INT, "type": _STR, "message": _STR}),  # the front end's errors
        "HandlerError": _obj({"code": _INT, "message": _STR, "error": _STR}, {"type": _STR, "field": _STR}),
        "RecordError": _obj({"error": _STR, "code": _INT}),  # a failed rolling-batch record
        "Ping": {"type": "object", "additionalProperties": status},
        "ModelsList": _obj({"models": {"type": "array", "items": _obj(
            {"modelName": _STR, "modelUrl": _STR, "status": _STR})}}),
        "ModelDescription": {"type": "array", "items": _obj({"modelName": _STR, "status": _STR, "workers": {
            "type": "array"}})},
        "Adapter": adapter,
        "AdapterList": _obj({"adapters": {"type": "array", "items": ref("Adapter")}}, {"nextPageToken": _STR}),
        "AdapterStatus": status,
    }


def component_schemas() -> dict[str, Any]:
    """Every component schema, by name."""
    return {**_lmi(), **_openai(), **_tgi(), **_djl()}
