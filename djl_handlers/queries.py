"""Questions the front end asks a model's handler outside inference, answered in the worker (the
front end has no tokenizer): the model's facts, tokenize, detokenize.

They arrive as a call of the handler function ``djl_handlers_query``
(:data:`djl_handlers.extensions.QUERY_HANDLER`, a djl_handlers extension DJL never calls), like
DJL's adapter calls: property ``op`` names the question, content ``data`` carries the client's JSON
body. The answer is an ``Output`` whose code is the HTTP status and whose body is the route's
reply in its dialect, errors included:

* ``model_info``: ``{"model_id", "dtype", "device", "max_model_len", "engine", "parameters_engine",
  "max_new_tokens_limit", "chat_template"}``;
* ``tokenize``: a body with ``inputs`` is TGI's (``[{"id", "text", "start", "stop"}]``, with the
  tokenizer's special tokens); one with ``prompt`` or ``messages`` is vLLM's
  (``{"count", "max_model_len", "tokens"[, "token_strs"]}``; a chat is rendered by the chat template
  with the same options as a chat completion);
* ``detokenize``: vLLM's ``{"tokens": [...]}`` → ``{"prompt"}``.

Errors are TGI's ``{"error", "error_type"}`` for TGI bodies, else OpenAI's nested error object.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional

from djl_handlers.dialects.openai.request import render_chat, template_options
from djl_handlers.dialects.openai.response import openai_error_object
from djl_handlers.dialects.openai.tools import check_messages, parse_tools, render_messages
from djl_handlers.dialects.tgi.response import tgi_error_object
from djl_handlers.errors import DjlHandlersError, InvalidRequest, message_of
from djl_handlers.io.compat import new_output
from djl_handlers.request.parser import check_text

if TYPE_CHECKING:
    from djl_handlers.service import InferenceService

__all__ = ["CHAT_TOKENIZE_KEYS", "DETOKENIZE_KEYS", "PROMPT_TOKENIZE_KEYS", "QUERY_OPS", "TGI_TOKENIZE_KEYS",
           "answer_query"]

QUERY_OPS = ("model_info", "tokenize", "detokenize")
PROMPT_TOKENIZE_KEYS = frozenset({"model", "prompt", "add_special_tokens", "return_token_strs"})
CHAT_TOKENIZE_KEYS = frozenset({"model", "messages", "add_generation_prompt", "continue_final_message",
                        "add_special_tokens", "return_token_strs", "chat_template_kwargs", "tools",
                        "chat_template", "media_io_kwargs", "mm_processor_kwargs"})
_DEFAULT_ONLY = ("chat_template", "media_io_kwargs", "mm_processor_kwargs")  # null only
DETOKENIZE_KEYS = frozenset({"model", "tokens"})
TGI_TOKENIZE_KEYS = frozenset({"inputs", "parameters", "stream"})


def answer_query(service: InferenceService, inputs: Any) -> Any:
    """The ``Output`` answering one query call (never raises)."""
    op = str(inputs.get_property("op") or "")
    tgi = False
    try:
        if op == "model_info":
            return _reply(inputs, 200, model_info(service))
        if op not in QUERY_OPS:
            raise InvalidRequest(f"unknown query {op!r}; one of {list(QUERY_OPS)}", field="op")
        body = _body(inputs)
        tgi = op == "tokenize" and "inputs" in body
        if tgi:
            return _reply(inputs, 200, tgi_tokenize(service, body))
        return _reply(inputs, 200, vllm_tokenize(service, body) if op == "tokenize" else detokenize(service, body))
    except DjlHandlersError as exc:
        error = (tgi_error_object(exc.status, exc.message) if tgi
                 else openai_error_object(exc.status, exc.message, exc.field))
        return _reply(inputs, exc.status, error)
    except Exception as exc:  # noqa: BLE001 - a tokenizer failure is this call's answer, not the worker's end
        message = f"{op} failed: {message_of(exc)}"
        return _reply(inputs, 500, tgi_error_object(500, message, "tokenizer") if tgi
                      else openai_error_object(500, message))


def model_info(service: InferenceService) -> dict[str, Any]:
    """What the front end reports about the model (``/v1/models``, ``/info``, ``/openapi.json``)."""
    config, engine = service.config, service.engine
    assert config is not None and engine is not None  # the service is initialized
    return {
        "model_id": config.model_id or config.model_dir,
        "dtype": config.dtype,
        "device": config.device,
        "max_model_len": int(engine.max_model_len),
        "engine": str(getattr(engine, "name", type(engine).__name__)),
        "parameters_engine": service.settings.engine,
        "max_new_tokens_limit": service.settings.max_new_tokens_limit,
        "chat_template": service.settings.chat_template is not None,
        "kind": service.kind,  # config/kinds.py: generation, embedding or rerank
    }


def vllm_tokenize(service: InferenceService, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``/tokenize``: a ``prompt`` (special tokens added by default) or chat ``messages``
    rendered by the chat template (none added by default, the template has them)."""
    tokenizer = _tokenizer(service)
    if "messages" in body:
        _check_keys(body, CHAT_TOKENIZE_KEYS)
        text, special = _render_chat(service, body), False
    else:
        _check_keys(body, PROMPT_TOKENIZE_KEYS)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise InvalidRequest("prompt must be a string (or send messages)", field="prompt")
        check_text(prompt, "prompt")
        text, special = prompt, True
    special = _flag(body, "add_special_tokens", special)
    ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=special)]
    reply: dict[str, Any] = {"count": len(ids), "max_model_len": model_info(service)["max_model_len"], "tokens": ids}
    if _flag(body, "return_token_strs", False):
        reply["token_strs"] = _token_strings(tokenizer, ids)
    return reply


def _render_chat(service: InferenceService, body: dict[str, Any]) -> str:
    template = service.settings.chat_template
    if template is None:
        raise InvalidRequest("this model has no chat template; send a prompt", field="messages")
    for key in _DEFAULT_ONLY:
        if body.get(key) is not None:
            raise InvalidRequest(f"{key} is not supported", field=key)
    messages = check_messages(body.get("messages"), check_text)
    plan = parse_tools({"tools": body.get("tools")})
    rendered, tools = render_messages(messages, plan, bool(getattr(template, "reads_tools", False)))
    return render_chat(template, rendered, tools, template_options(body))


def detokenize(service: InferenceService, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``/detokenize``: ``tokens`` (ids of this tokenizer) → ``{"prompt"}``."""
    _check_keys(body, DETOKENIZE_KEYS)
    tokens = body.get("tokens")
    size = _vocab_size(_tokenizer(service))
    if not isinstance(tokens, list) or not all(_token_id(t, size) for t in tokens):
        bound = f" below {size}" if size else ""
        raise InvalidRequest(f"tokens must be a list of token ids (integers >= 0{bound})", field="tokens")
    try:
        return {"prompt": _tokenizer(service).decode(tokens)}
    except (ValueError, OverflowError, IndexError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"tokens holds an id this tokenizer does not know ({exc})", field="tokens") from None


def tgi_tokenize(service: InferenceService, body: dict[str, Any]) -> list[dict[str, Any]]:
    """TGI's ``/tokenize``: one ``{"id", "text", "start", "stop"}`` per token of ``inputs`` (with
    the tokenizer's special tokens; ``start``/``stop`` are character offsets in ``inputs``)."""
    _check_keys(body, TGI_TOKENIZE_KEYS)
    text = body.get("inputs")
    if not isinstance(text, str):
        raise InvalidRequest("inputs must be a string", field="inputs")
    check_text(text, "inputs")
    if body.get("parameters") is not None and not isinstance(body["parameters"], dict):
        raise InvalidRequest("parameters must be an object", field="parameters")
    _flag(body, "stream", False)  # accepted (TGI's body has it), ignored: a tokenization is not streamed
    tokenizer = _tokenizer(service)
    ids, spans = _offsets(tokenizer, text)
    return [{"id": i, "text": text[start:stop], "start": start, "stop": stop}
            for i, (start, stop) in zip(ids, spans, strict=True)]


def _offsets(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and character spans: a fast tokenizer's offset mapping, else spans found by
    decoding each prefix of the ids (a token that adds no text gets an empty span)."""
    try:
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=True)
        return [int(i) for i in enc["input_ids"]], [(int(a), int(b)) for a, b in enc["offset_mapping"]]
    except (TypeError, KeyError, NotImplementedError, ValueError):
        pass
    ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=True)]
    spans, done = [], 0
    for n in range(1, len(ids) + 1):
        end = max(done, min(len(text), len(tokenizer.decode(ids[:n], skip_special_tokens=True))))
        spans.append((done, end))
        done = end
    return ids, spans


def _token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if callable(convert):
        return [str(t) for t in convert(ids)]
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def _vocab_size(tokenizer: Any) -> Optional[int]:
    try:
        return int(len(tokenizer))
    except TypeError:
        size = getattr(tokenizer, "vocab_size", None)
        return int(size) if isinstance(size, int) else None


def _token_id(value: Any, size: Optional[int]) -> bool:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return ok and (size is None or value < size)


def _tokenizer(service: InferenceService) -> Any:
    tokenizer = service.engine.tokenizer if service.engine is not None else None
    if tokenizer is None:
        raise InvalidRequest("this engine has no tokenizer to answer with", field="body")
    return tokenizer


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false", field=name)
    return value


def _check_keys(body: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidRequest(f"unsupported field(s) {unknown}", field=unknown[0])
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise InvalidRequest("model must be a string", field="model")


def _body(inputs: Any) -> dict[str, Any]:
    content = inputs.get_content()
    raw = content.get("data") if not content.is_empty() else None
    try:
        body = json.loads(bytes(raw or b"").decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidRequest("request body is not valid JSON", field="body") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", field="body")
    return body


def _reply(inputs: Any, code: int, body: Any) -> Any:
    out = new_output(inputs)
    out.set_code(code)
    out.set_message("OK" if code < 300 else "query refused")
    out.add_property("Content-Type", "application/json")
    out.add(json.dumps(body, ensure_ascii=False).encode("utf-8"), key="data")
    return out
