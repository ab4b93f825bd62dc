"""The OpenAPI 3.1 description of every route of the local server, served at ``/openapi.json``.

Request bodies are built from the tables the parsers validate with, never from a copy: the LMI
``parameters`` from ``GenerationParameters``' validators and the support table for the served
engine (:mod:`djl_handlers.params.schema`), the OpenAI bodies from the dialect's field table
(:mod:`djl_handlers.dialects.openai.fields`), the LMI top level from ``request.parser``'s key list,
the tokenize bodies from :mod:`djl_handlers.queries`' key lists. Response shapes are
:mod:`.openapi_schemas`. Streamed bodies (``text/event-stream``, ``application/jsonlines``) give the
schema of one event or line under ``x-stream-item``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from djl_handlers.__about__ import __version__
from djl_handlers.dialects.openai.fields import CHAT, COMPLETION, FIELDS, PARAMETER
from djl_handlers.params.schema import parameter_schema, parameters_object_schema, structured_schema
from djl_handlers.params.structured import FIELDS as STRUCTURED_FIELDS
from djl_handlers.queries import CHAT_TOKENIZE_KEYS, DETOKENIZE_KEYS, PROMPT_TOKENIZE_KEYS, TGI_TOKENIZE_KEYS
from djl_handlers.request.parser import TOP_LEVEL_KEYS
from djl_handlers.server.access import PROBES, AccessSettings
from djl_handlers.server.openapi_pooling import pooling_paths
from djl_handlers.server.openapi_schemas import component_schemas, ref
from djl_handlers.sessions.gate import HEADER_CLOSED_SESSION_ID, HEADER_SESSION_ID, REQUEST_TYPES

__all__ = ["openapi_document"]

_JSON, _SSE, _LINES, _TEXT = "application/json", "text/event-stream", "application/jsonlines", "text/plain"
_DONE = {"const": "[DONE]"}
_ADAPTER_HEADER = {"name": "X-Amzn-SageMaker-Adapter-Identifier", "in": "header", "required": False,
                   "schema": {"type": "string"}, "description": "the LoRA adapter to answer with"}
# LMI's stateful sessions (option.enable_stateful_sessions, async mode; docs/chat.md)
_SESSION_HEADER = {"name": HEADER_SESSION_ID, "in": "header", "required": False, "schema": {"type": "string"},
                   "description": "the stateful session to serve the request in (an unknown one: 424)"}
_SESSION_REQUEST = {"type": "object", "required": ["requestType"],
                    "properties": {"requestType": {"enum": list(REQUEST_TYPES)}}}
_SESSION_RESULT = {"type": "object", "required": ["result"], "additionalProperties": False,
                   "properties": {"result": {"type": "string"}}}
_SESSION_HEADERS = {
    HEADER_SESSION_ID: {"description": "NEW_SESSION's answer: '<id>; Expires=<UTC>'", "schema": {"type": "string"}},
    HEADER_CLOSED_SESSION_ID: {"description": "CLOSE's answer: the closed session's id", "schema": {"type": "string"}},
}


def _any(*names: str, extra: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"anyOf": [*(ref(n) for n in names), *extra]}


class _Bodies:
    """The request body schemas for one engine (``parameters_engine``) and token limit."""

    def __init__(self, engine: str, max_new_tokens: int) -> None:
        self.engine, self.max_new_tokens = engine, max_new_tokens

    def parameters(self, extra: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
        return parameters_object_schema(self.engine, max_new_tokens=self.max_new_tokens, extra=extra)

    def lmi(self) -> dict[str, Any]:
        names = {"type": "string"}
        keys = {
            "inputs": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}]},
            "parameters": {"anyOf": [self.parameters(), {"type": "null"}]},
            "stream": {"type": "boolean"},
            "adapters": {"anyOf": [names, {"type": "array", "items": {"anyOf": [names, {"type": "null"}]}},
                                   {"type": "null"}]},
        }
        return {"type": "object", "required": ["inputs"], "additionalProperties": False,
                "properties": {key: keys[key] for key in TOP_LEVEL_KEYS}}

    def tgi(self) -> dict[str, Any]:
        temperature = {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}],
                       "description": "TGI: strictly positive (422 otherwise)"}
        extra: dict[str, dict[str, Any]] = {"adapter_id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                 "watermark": {"enum": [False, None]}, "temperature": temperature}
        body = self.lmi()
        body["properties"] = {**body["properties"], "inputs": {"type": "string"},
                              "parameters": {"anyOf": [self.parameters(extra), {"type": "null"}]}}
        return body

    def _field(self, name: str, api: str) -> dict[str, Any]:
        spec = FIELDS[api][name]
        if spec.handling != PARAMETER:
            return {**dict(spec.schema), **({"description": spec.description} if spec.description else {})}
        assert spec.parameter is not None
        if spec.parameter in STRUCTURED_FIELDS:
            return structured_schema(spec.parameter)
        return parameter_schema(spec.parameter, self.engine, max_new_tokens=self.max_new_tokens)

    def openai(self, api: str) -> dict[str, Any]:
        props = {name: self._field(name, api) for name in sorted(FIELDS[api])}
        props["adapters"] = {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "the LoRA adapter"}
        return {"type": "object", "required": ["messages" if api == CHAT else "prompt"],
                "additionalProperties": False, "properties": props}

    def tokenize(self) -> dict[str, Any]:
        chat = FIELDS[CHAT]
        flag = {"anyOf": [{"type": "boolean"}, {"type": "null"}]}
        known: dict[str, Any] = {
            "model": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "prompt": {"type": "string"},
            "add_special_tokens": flag, "return_token_strs": flag, "inputs": {"type": "string"},
            "parameters": {"anyOf": [{"type": "object"}, {"type": "null"}]}, "stream": flag,
            **{k: {"type": "null"} for k in ("chat_template", "media_io_kwargs", "mm_processor_kwargs")},
            **{k: self._field(k, CHAT) for k in ("messages", "add_generation_prompt", "continue_final_message",
                                                  "chat_template_kwargs", "tools") if k in chat},
        }

        def shape(keys: frozenset[str], required: str, description: str) -> dict[str, Any]:
            return {"type": "object", "required": [required], "additionalProperties": False,
                    "properties": {k: known[k] for k in sorted(keys)}, "description": description}

        return {"anyOf": [shape(TGI_TOKENIZE_KEYS, "inputs", "TGI"), shape(PROMPT_TOKENIZE_KEYS, "prompt", "vLLM"),
                          shape(CHAT_TOKENIZE_KEYS, "messages", "vLLM chat")]}

    def detokenize(self) -> dict[str, Any]:
        props = {"model": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                 "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}}
        return {"type": "object", "required": ["tokens"], "additionalProperties": False,
                "properties": {k: props[k] for k in sorted(DETOKENIZE_KEYS)}}


def _json_body(schema: dict[str, Any], *, text: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {_JSON: {"schema": schema}}
    if text:
        content[_TEXT] = {"schema": {"type": "string"}}
    return {"required": True, "content": content}


def _ok(content: dict[str, Any] | None = None, errors: tuple[str, ...] = ("DjlError",),
        ok: str = "the answer") -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": ok}}
    if content:
        responses["200"]["content"] = content
    responses["default"] = {"description": "an error, in the route's dialect",
                            "content": {_JSON: {"schema": _any(*errors)}}}
    return responses


def _streams(*names: str, extra: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """A jsonlines body: one of ``names`` per line (``x-stream-item``; OpenAPI 3.1 has no keyword)."""
    return {"schema": {"type": "string"}, "x-stream-item": _any(*names, extra=extra)}


def _events(*names: str, done: bool = False) -> dict[str, Any]:
    """A ``text/event-stream`` body: ``schema`` is one event (OpenAPI 3.1's reading), whose ``data``
    is JSON of one of ``names`` (``contentSchema``), or ``[DONE]`` when ``done``."""
    item = _any(*names)
    data: dict[str, Any] = {"type": "string", "contentMediaType": _JSON, "contentSchema": item}
    if done:
        data = {"type": "string", "if": _DONE, "else": {"contentMediaType": _JSON, "contentSchema": item}}
    event = {"type": "object", "required": ["data"], "properties": {"data": data, "event": {"type": "string"}}}
    return {"schema": event, "x-stream-item": _any(*names, extra=(_DONE,) if done else ())}


def _inference(bodies: _Bodies) -> dict[str, Any]:
    lmi_ok = {_JSON: {"schema": _any("LmiResult", "LmiResults", "ThreePResult", "ChatCompletion", "Completion",
                                      "TgiResults", extra=(_SESSION_RESULT,))},
              _LINES: _streams("LmiStreamLine", "LmiOutputsLine", "ThreePResult", "ChatCompletionChunk", "Completion",
                               "RecordError"),
              _SSE: _events("LmiStreamLine", "TgiStreamEvent", "ChatCompletionChunk", "Completion", "OpenAIError",
                            "TgiError", "RecordError", done=True),
              _TEXT: {"schema": {"type": "string"}}}
    lmi_errors = ("DjlError", "HandlerError", "RecordError", "LmiResult", "OpenAIError", "TgiError", "ThreePResult")
    lmi_body = _json_body({"anyOf": [bodies.lmi(), bodies.openai(CHAT), bodies.openai(COMPLETION), _SESSION_REQUEST]},
                          text=True)

    def lmi(summary: str) -> dict[str, Any]:
        responses = _ok(lmi_ok, lmi_errors)
        responses["200"]["headers"] = _SESSION_HEADERS
        return {"summary": summary, "parameters": [_ADAPTER_HEADER, _SESSION_HEADER], "requestBody": lmi_body,
                "responses": responses}

    def openai(api: str, whole: str, chunk: str) -> dict[str, Any]:
        content = {_JSON: {"schema": ref(whole)}, _SSE: _events(chunk, "OpenAIError", done=True)}
        return {"post": {"summary": f"OpenAI {api}", "parameters": [_ADAPTER_HEADER, _SESSION_HEADER],
                         "requestBody": _json_body(bodies.openai(api)),
                         "responses": _ok(content, ("OpenAIError", "DjlError"))}}

    tgi_content = {_JSON: {"schema": ref("TgiResults")}, _SSE: _events("TgiStreamEvent", "TgiError")}
    tgi = {"summary": "TGI generate", "parameters": [_ADAPTER_HEADER], "requestBody": _json_body(bodies.tgi()),
           "responses": _ok(tgi_content, ("TgiError", "DjlError"))}
    model = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    version = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "/invocations": {"post": lmi("Inference (LMI schema; OpenAI bodies recognised by shape)")},
        "/predictions/{model}": {"parameters": [model], "post": lmi("Inference on the named model")},
        "/predictions/{model}/{version}": {"parameters": [model, version], "post": lmi("Inference on the named model")},
        "/v1/chat/completions": openai(CHAT, "ChatCompletion", "ChatCompletionChunk"),
        "/v1/completions": openai(COMPLETION, "Completion", "Completion"),
        "/generate": {"post": tgi},
        "/generate_stream": {"post": {**tgi, "summary": "TGI generate_stream",
                                      "responses": _ok({_SSE: tgi_content[_SSE]}, ("TgiError", "DjlError"))}},
        "/": {"post": {**tgi, "summary": "TGI compatibility route"}},
    }


def _management() -> dict[str, Any]:
    model = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}

    def query(key: str, kind: str = "string", required: bool = False) -> dict[str, Any]:
        return {"name": key, "in": "query", "required": required, "schema": {"type": kind}}

    def json_ok(schema: str) -> dict[str, Any]:
        return _ok({_JSON: {"schema": ref(schema)}})

    options = [query("preload"), query("pin")]
    collection = {"get": {"summary": "List adapters", "parameters": [query("limit", "integer"),
                                                                   query("next_page_token", "integer")],
                          "responses": json_ok("AdapterList")},
                  "post": {"summary": "Register an adapter", "parameters": [query("name", required=True),
                                                                          query("src", required=True), *options],
                           "responses": json_ok("AdapterStatus")}}
    item = {"get": {"summary": "Describe an adapter", "responses": json_ok("Adapter")},
            "delete": {"summary": "Unregister an adapter", "responses": json_ok("AdapterStatus")}}
    update = {"post": {"summary": "Update an adapter", "parameters": [query("src"), *options],
                       "responses": json_ok("AdapterStatus")}}
    return {
        "/models/{model}/adapters": {"parameters": [model], **collection},
        "/models/{model}/adapters/{name}": {"parameters": [model, name], **item},
        "/models/{model}/adapters/{name}/update": {"parameters": [model, name], **update},
        "/adapters": collection,
        "/adapters/{name}": {"parameters": [name], **item},
        "/adapters/{name}/update": {"parameters": [name], **update},
    }


def _descriptive(bodies: _Bodies) -> dict[str, Any]:
    def get(summary: str, schema: str | None, content_type: str = _JSON, errors: tuple[str, ...] = ("DjlError",)
            ) -> dict[str, Any]:
        content = {content_type: {"schema": ref(schema) if schema else {"type": "string"}}}
        return {"get": {"summary": summary, "responses": _ok(content, errors)}}

    model = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    ping = get("Health, DJL's per-model map (503 when unhealthy)", "Ping")
    query_errors = ("OpenAIError", "TgiError", "DjlError")
    return {
        "/ping": {**ping, "post": ping["get"]},
        "/health": {"get": {"summary": "200 while the worker is up, else 503 (empty body)",
                            "responses": {"200": {"description": "healthy"}, "503": {"description": "unhealthy"}}}},
        "/models": get("The served model (DJL)", "ModelsList"),
        "/models/{model}": {"parameters": [model], **get("The model's settings and worker (DJL)", "ModelDescription")},
        "/metrics": get("Prometheus metrics", None, _TEXT),
        "/v1/models": get("OpenAI's model list: the model and its LoRA adapters", "ModelList", errors=("OpenAIError",)),
        "/info": get("TGI's model information", "TgiInfo", errors=("TgiError", "DjlError")),
        "/tokenize": {"post": {"summary": "Tokenize (TGI body: inputs; vLLM body: prompt or messages)",
                               "requestBody": _json_body(bodies.tokenize()),
                               "responses": _ok({_JSON: {"schema": _any("TokenizeResult", "TgiTokens")}},
                                                query_errors)}},
        "/detokenize": {"post": {"summary": "Detokenize (vLLM)", "requestBody": _json_body(bodies.detokenize()),
                                 "responses": _ok({_JSON: {"schema": ref("DetokenizeResult")}}, query_errors)}},
        "/openapi.json": {"get": {"summary": "This description",
                                  "responses": _ok({_JSON: {"schema": {"type": "object"}}})}},
    }


def openapi_document(facts: Mapping[str, Any] | None, model_name: str,
                     access: AccessSettings | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document for the model ``facts`` (``model_info``: its parameters engine and
    token limit; the HF engine's rules when unknown) and the server's ``access`` rules."""
    facts = facts or {}
    bodies = _Bodies(str(facts.get("parameters_engine") or "huggingface"),
                     int(facts.get("max_new_tokens_limit") or 4096))
    paths = {**_inference(bodies), **pooling_paths(), **_management(), **_descriptive(bodies)}
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": f"djl-handlers serve: {model_name}", "version": __version__,
                 "description": f"Generation parameters as engine {bodies.engine} accepts them."},
        "paths": paths,
        "components": {"schemas": component_schemas()},
    }
    if access is not None and access.api_key:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
        if not access.protect_probes:
            for path in PROBES:
                for operation in paths[path].values():
                    if isinstance(operation, dict) and "responses" in operation:
                        operation["security"] = []
    return document
