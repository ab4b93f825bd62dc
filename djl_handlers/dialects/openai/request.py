"""OpenAI-style request bodies (chat completions and completions) → LMI request fields.

``openai_request`` turns one chat or completions item into a ``Request``: the LoRA adapter chosen
by ``adapters``, the SageMaker header or ``model``, then ``chat_to_lmi`` / ``completion_to_lmi``,
which validate the OpenAI fields and return the prompt plus an
LMI ``parameters`` dict (validated afterwards by ``GenerationParameters.from_dict`` like any
request), the formatter name, the ``ResponseOptions`` the OpenAI formatters read (``model``,
``logprobs``, ``top_logprobs``, ``stream_options.include_usage``) and the ``ToolPlan``.

Rules (documented in docs/schema.md): ``temperature`` defaults to 1.0 and 0 means greedy, as
OpenAI; ``max_tokens`` (or ``max_completion_tokens``) defaults to 256; ``n`` and ``best_of``
must be 1; fields that ask for features we do not have (suffix, audio, ...) are rejected with a
400 naming them; bookkeeping fields (``user``, ``metadata``, ``store``) are accepted and ignored.

Structured output (docs/structured-output.md): ``response_format`` (``text``, ``json_object``,
``json_schema``) and vLLM's extra fields ``guided_json``/``guided_regex``/``guided_choice``/
``guided_grammar``/``guided_json_object`` become the LMI ``guided_*`` parameters. Tool calling
(chat): ``tools``/``tool_choice``/``parallel_tool_calls`` are handled by
:mod:`djl_handlers.dialects.openai.tools`; forced calls become a ``guided_json`` constraint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from djl_handlers.dialects.openai.tools import check_messages, parse_tools, render_messages
from djl_handlers.errors import InvalidParameter, InvalidRequest
from djl_handlers.lora.selection import openai_adapter, select_adapters
from djl_handlers.params.translate import is_sampling
from djl_handlers.request.parser import ChatTemplate, ParserSettings, check_text, generation_parameters
from djl_handlers.request.records import Request, ResponseOptions, ToolPlan

DEFAULT_MAX_TOKENS = 256
IGNORED = ("user", "metadata", "store", "service_tier", "logit_bias")
GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_json_object")
COMMON = ("model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n",
          "stream", "stream_options", "frequency_penalty", "presence_penalty", "logprobs", "top_k",
          "repetition_penalty", "response_format", *GUIDED)
CHAT_KEYS = frozenset((*COMMON, *IGNORED, "messages", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls"))
COMPLETION_KEYS = frozenset((*COMMON, *IGNORED, "prompt", "echo", "best_of"))


@dataclass
class OpenAIRequest:
    """The LMI view of an OpenAI request."""

    prompt: str
    parameters: dict[str, Any]
    stream: bool
    formatter: str
    options: ResponseOptions = field(default_factory=ResponseOptions)
    tools: Optional[ToolPlan] = None  # set when the reply may be a tool call


def openai_request(item: Any, body: dict[str, Any], settings: ParserSettings, *, chat: bool) -> Request:
    """One ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` item as a ``Request``."""
    rest = {k: v for k, v in body.items() if k != "adapters"}
    adapters = select_adapters(body.get("adapters"), item, 1, settings.adapters)
    if not adapters:
        by_model = openai_adapter(body.get("model"), settings.adapters)
        adapters = (by_model,) if by_model else ()
    req = chat_to_lmi(rest, settings.chat_template) if chat else completion_to_lmi(rest)
    gen = generation_parameters(item, req.parameters, settings)
    options = req.options
    if adapters and adapters[0]:
        options = replace(options, model=adapters[0])  # the response names the adapter that answered
    return Request(prompt=req.prompt, params=gen, stream=req.stream, output_formatter=req.formatter,
                   inputs=req.prompt, seed=gen.seed if is_sampling(gen) else None,
                   properties=dict(item.get_properties()), adapters=adapters, tools=req.tools,
                   response_options=options)


def chat_to_lmi(body: dict[str, Any], chat_template: Optional[ChatTemplate]) -> OpenAIRequest:
    """Validate a ``/v1/chat/completions`` body and render its messages with the chat template."""
    _reject_unknown(body, CHAT_KEYS)
    messages = check_messages(body.get("messages"), check_text)
    plan = parse_tools(body)
    if chat_template is None:
        raise InvalidRequest(
            "this model has no chat template, so chat requests are not supported; send 'inputs' or 'prompt'",
            field="messages",
        )
    rendered, tools = render_messages(messages, plan, bool(getattr(chat_template, "reads_tools", False)))
    prompt = chat_template(rendered, tools=tools) if tools else chat_template(rendered)
    logprobs = _bool(body.get("logprobs", False), "logprobs")
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20):
        raise InvalidParameter("top_logprobs must be an integer in [0, 20]", field="top_logprobs")
    stream = _bool(body.get("stream", False), "stream")
    options = _options(body, logprobs=logprobs, top_logprobs=top or 0)
    params = _common_parameters(body)
    if plan.schema is not None:
        if any(k.startswith("guided_") for k in params):
            raise InvalidParameter("a forced tool call (tool_choice) cannot be combined with response_format "
                                   "or guided_* constraints", field="tool_choice")
        params["guided_json"] = plan.schema
    if plan.may_call:
        return OpenAIRequest(prompt, params, stream, "chat_tools_sse" if stream else "chat_json", options, plan)
    return OpenAIRequest(prompt, params, stream, "chat_sse" if stream else "chat_json", options)


def completion_to_lmi(body: dict[str, Any]) -> OpenAIRequest:
    """Validate a ``/v1/completions`` body."""
    _reject_unknown(body, COMPLETION_KEYS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidRequest("prompt must be a string (one prompt per request)", field="prompt")
    check_text(prompt, "prompt")
    if body.get("best_of") not in (None, 1):
        raise InvalidParameter("best_of must be 1 (one sequence per request)", field="best_of")
    logprobs = body.get("logprobs")
    if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool) or not 0 <= logprobs <= 5):
        raise InvalidParameter("logprobs must be an integer in [0, 5]", field="logprobs")
    params = _common_parameters(body)
    if _bool(body.get("echo", False), "echo"):
        params["return_full_text"] = True
    stream = _bool(body.get("stream", False), "stream")
    options = _options(body, logprobs=logprobs)
    return OpenAIRequest(prompt, params, stream, "completion_sse" if stream else "completion_json", options)


def _common_parameters(body: dict[str, Any]) -> dict[str, Any]:
    if body.get("n") not in (None, 1):
        raise InvalidParameter("n must be 1 (one choice per request)", field="n")
    params: dict[str, Any] = {}
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise InvalidParameter(f"{key} must be a positive integer, got {json.dumps(max_tokens)}", field=key)
    params["max_new_tokens"] = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else temperature
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        if not 0 <= temperature <= 2:
            raise InvalidParameter(f"temperature must be in [0, 2], got {temperature}", field="temperature")
        if temperature > 0:
            params.update(do_sample=True, temperature=temperature)
    else:
        raise InvalidParameter(f"temperature must be a number, got {json.dumps(temperature)}", field="temperature")
    for key in ("top_p", "seed", "top_k", "repetition_penalty"):
        if body.get(key) is not None:
            params[key] = body[key]
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            params[key] = body[key]
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        params["stop_sequences"] = stop
    params.update(_structured(body))
    return params


def _structured(body: dict[str, Any]) -> dict[str, Any]:
    """``response_format`` and vLLM's top-level ``guided_*`` fields as LMI parameters (one at most)."""
    params = response_format(body.get("response_format"))
    for key in GUIDED:
        if body.get(key) is not None:
            if params:
                raise InvalidParameter(f"{key} cannot be combined with response_format or another guided_* field",
                                       field=key)
            params[key] = body[key]
    return params


def response_format(value: Any) -> dict[str, Any]:
    """LMI ``guided_*`` parameters for OpenAI's ``response_format`` (``text``: none)."""
    if value is None:
        return {}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"guided_json_object": True}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidParameter('response_format.json_schema must be {"name": ..., "schema": {...}}',
                                   field="response_format")
        schema = spec.get("schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise InvalidParameter("response_format.json_schema.schema must be a JSON Schema object",
                                   field="response_format")
        if not isinstance(spec.get("strict", False), (bool, type(None))):
            raise InvalidParameter("response_format.json_schema.strict must be true or false", field="response_format")
        return {"guided_json": schema}
    raise InvalidParameter('response_format.type must be "text", "json_object" or "json_schema"',
                           field="response_format")


def _options(body: dict[str, Any], logprobs: Optional[bool | int], top_logprobs: int = 0) -> ResponseOptions:
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise InvalidParameter("stream_options must be an object", field="stream_options")
    return ResponseOptions(model=str(body.get("model") or ""), logprobs=logprobs,
                           top_logprobs=top_logprobs,
                           include_usage=bool(stream_options and stream_options.get("include_usage")))


def _reject_unknown(body: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidRequest(f"unsupported field(s) {unknown}", field=unknown[0])


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidParameter(f"{name} must be true or false, got {json.dumps(value)}", field=name)
    return value
