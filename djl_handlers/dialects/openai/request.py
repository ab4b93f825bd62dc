"""OpenAI-style request bodies (chat completions and completions) → LMI request fields.

``openai_request`` turns one chat or completions item into a ``Request``: the LoRA adapter chosen
by ``adapters``, the SageMaker header or ``model``, then ``chat_to_lmi`` / ``completion_to_lmi``,
which validate the fields and return the prompt plus an LMI ``parameters`` dict (validated
afterwards by ``GenerationParameters.from_dict`` like any request), the formatter name, the
``ResponseOptions`` the OpenAI formatters read (``model``, ``logprobs``, ``top_logprobs``,
``stream_options.include_usage``) and the ``ToolPlan``.

Which fields are accepted and what becomes of each — OpenAI's own and vLLM's extras
(``ignore_eos``, ``min_tokens``, ``top_k``, ``min_p``, ``stop_token_ids``, ``chat_template_kwargs``,
...) — is the table in :mod:`djl_handlers.dialects.openai.fields`. An error about a field names the
field as the client spelled it, also when its LMI parameter refused it (``ignore_eos``, not
``ignore_eos_token``).

Rules (documented in docs/schema.md): ``temperature`` defaults to 1.0 and 0 means greedy, as
OpenAI; ``max_tokens`` (or ``max_completion_tokens``) defaults to 256; ``n`` (and, for completions,
``best_of``, with ``n`` then 1 unless given) become the LMI parameters of the same names, refused
with greedy decoding (``temperature: 0``) as vLLM does; fields that ask for features we do not
have (suffix, audio, beam search, ...) are
accepted only at their default value, else rejected with a 400 naming them.

Structured output (docs/structured-output.md): ``response_format`` (``text``, ``json_object``,
``json_schema``), vLLM's ``structured_outputs`` object and its older top-level
``guided_json``/``guided_regex``/``guided_choice``/``guided_grammar``/``guided_json_object`` become
the LMI ``guided_*`` parameters. Tool calling (chat): ``tools``/``tool_choice``/``parallel_tool_calls``
are handled by :mod:`djl_handlers.dialects.openai.tools`; forced calls become a ``guided_json`` constraint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Union

from djl_handlers.dialects.openai.fields import (
    CHAT,
    COMPLETION,
    DEFAULT_MAX_TOKENS,
    DEFAULT_ONLY,
    FIELDS,
    MAX_COMPLETION_LOGPROBS,
    MAX_TEMPERATURE,
    MAX_TOP_LOGPROBS,
    PARAMETER,
    allowed,
)
from djl_handlers.dialects.openai.reading import reply_reading
from djl_handlers.dialects.openai.tools import check_messages, parse_tools, render_messages
from djl_handlers.errors import DjlHandlersError, InvalidParameter, InvalidRequest
from djl_handlers.lora.selection import openai_adapter, select_adapters
from djl_handlers.media.records import ImageRef
from djl_handlers.media.refs import check_image_count
from djl_handlers.params.support import supported_parameters
from djl_handlers.params.translate import is_sampling
from djl_handlers.request.parser import ChatTemplate, ParserSettings, check_text, generation_parameters
from djl_handlers.request.records import Request, ResponseOptions, ToolPlan

__all__ = ["CHAT_KEYS", "COMPLETION_KEYS", "DEFAULT_MAX_TOKENS", "OpenAIRequest", "chat_to_lmi",
           "completion_prompts", "completion_to_lmi", "openai_request", "response_format", "with_prompts"]

CHAT_KEYS = allowed(CHAT)
COMPLETION_KEYS = allowed(COMPLETION)
GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_json_object")
# LMI parameter -> the OpenAI field that sets it, where the names differ (for error messages)
_BODY_NAMES = {f.parameter: f.name for f in FIELDS[CHAT].values() if f.parameter and f.parameter != f.name}
_BODY_NAMES["max_new_tokens"] = "max_tokens"
_BODY_NAMES["decoder_input_details"] = "echo"  # set by echo with logprobs
Prompt = Union[str, tuple[int, ...]]  # a completions prompt: text or token ids
# keys chat_template_kwargs may not set: the call's own arguments, set by the fields that own them
_TEMPLATE_RESERVED = frozenset({"conversation", "messages", "tools", "tokenize", "return_dict", "chat_template",
                                "add_generation_prompt", "continue_final_message", "documents"})


@dataclass
class OpenAIRequest:
    """The LMI view of an OpenAI request."""

    prompt: str
    parameters: dict[str, Any]
    stream: bool
    formatter: str
    options: ResponseOptions = field(default_factory=ResponseOptions)
    tools: Optional[ToolPlan] = None  # set when the reply may be a tool call
    add_special_tokens: Optional[bool] = None  # None: the tokenizer's default
    prompts: tuple[Prompt, ...] = ()  # completions: every prompt (text or token ids), in order
    media: tuple[ImageRef, ...] = ()  # chat: the image parts, in prompt order (dialects/openai/content.py)


def openai_request(item: Any, body: dict[str, Any], settings: ParserSettings, *, chat: bool) -> Request:
    """One ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` item as a ``Request``."""
    rest = {k: v for k, v in body.items() if k != "adapters"}
    adapters = select_adapters(body.get("adapters"), item, 1, settings.adapters)
    if not adapters:
        by_model = openai_adapter(body.get("model"), settings.adapters)
        adapters = (by_model,) if by_model else ()
    req = (chat_to_lmi(rest, settings.chat_template, reasoning=settings.reasoning_parser,
                       tool_parser=settings.tool_call_parser) if chat else completion_to_lmi(rest))
    check_image_count(req.media, settings.image_limit)
    if "top_n_tokens" not in supported_parameters(settings.engine):
        req.parameters.pop("top_n_tokens", None)  # the engine reports no alternatives: the chosen token only
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        # the default never exceeds the server's cap (option.max_new_tokens_limit), as LMI's does not
        req.parameters["max_new_tokens"] = min(DEFAULT_MAX_TOKENS, settings.max_new_tokens_limit)
    try:
        gen = generation_parameters(item, req.parameters, settings)
    except InvalidParameter as exc:
        raise _in_body_terms(exc) from None
    options = req.options
    if adapters and adapters[0]:
        options = replace(options, model=adapters[0])  # the response names the adapter that answered
    request = Request(prompt=req.prompt, params=gen, stream=req.stream, output_formatter=req.formatter,
                      inputs=req.prompt, seed=gen.seed if is_sampling(gen) else None,
                      properties=dict(item.get_properties()), adapters=adapters, tools=req.tools,
                      response_options=options, add_special_tokens=req.add_special_tokens, media=req.media)
    return with_prompts(request, req.prompts)


def chat_to_lmi(body: dict[str, Any], chat_template: Optional[ChatTemplate], *, reasoning: Optional[str] = None,
                tool_parser: str = "json") -> OpenAIRequest:
    """Validate a ``/v1/chat/completions`` body and render its messages with the chat template;
    ``reasoning`` and ``tool_parser``: the model's parsers (:mod:`.reading`)."""
    _check_fields(body, CHAT)
    images: list[ImageRef] = []
    messages = check_messages(body.get("messages"), check_text, images)
    plan = parse_tools(body)
    if chat_template is None:
        raise InvalidRequest(
            "this model has no chat template, so chat requests are not supported; send 'inputs' or 'prompt'",
            field="messages",
        )
    rendered, tools = render_messages(messages, plan, bool(getattr(chat_template, "reads_tools", False)))
    prompt = render_chat(chat_template, rendered, tools, template_options(body))
    logprobs = _bool(body.get("logprobs"), "logprobs", False)
    top = body.get("top_logprobs")
    if top is not None and not _int_in(top, 0, MAX_TOP_LOGPROBS):
        raise InvalidParameter(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]", field="top_logprobs")
    stream = _bool(body.get("stream"), "stream", False)
    options = _options(body, logprobs=logprobs, top_logprobs=top or 0)
    params = _common_parameters(body, CHAT)
    if logprobs and top:
        params["top_n_tokens"] = top  # each token's N most likely alternatives
    special = _optional_bool(body, "add_special_tokens")
    if plan.schema is not None:
        if any(k.startswith("guided_") for k in params):
            raise InvalidParameter("a forced tool call (tool_choice) cannot be combined with response_format "
                                   "or guided_* constraints", field="tool_choice")
        params["guided_json"] = plan.schema
    options = reply_reading(body, reasoning, tool_parser, plan, params, options)
    if plan.may_call or options.reasoning_parser:
        return OpenAIRequest(prompt, params, stream, "chat_tools_sse" if stream else "chat_json", options, plan,
                             add_special_tokens=special, media=tuple(images))
    return OpenAIRequest(prompt, params, stream, "chat_sse" if stream else "chat_json", options,
                         add_special_tokens=special, media=tuple(images))


def template_options(body: dict[str, Any]) -> dict[str, Any]:
    """The chat template's keyword arguments a chat body sets: ``add_generation_prompt`` (default
    true; false with ``continue_final_message``), ``continue_final_message`` and
    ``chat_template_kwargs`` — only those that differ from a plain render."""
    extra = body.get("chat_template_kwargs")
    if extra is not None and not isinstance(extra, dict):
        raise InvalidParameter("chat_template_kwargs must be an object", field="chat_template_kwargs")
    reserved = sorted(set(extra or {}) & _TEMPLATE_RESERVED)
    if reserved:
        raise InvalidParameter(f"chat_template_kwargs may not set {reserved}", field="chat_template_kwargs")
    options: dict[str, Any] = dict(extra or {})
    cont = _bool(body.get("continue_final_message"), "continue_final_message", False)
    generation = _optional_bool(body, "add_generation_prompt")
    if cont and generation:
        raise InvalidParameter("continue_final_message and add_generation_prompt cannot both be true",
                               field="continue_final_message")
    if cont:
        options["continue_final_message"] = True
        generation = False
    if generation is False:
        options["add_generation_prompt"] = False
    return options


def render_chat(template: ChatTemplate, messages: list[dict[str, Any]], tools: Any, options: dict[str, Any]) -> str:
    """The prompt the model's chat template makes of ``messages``; a template that fails on the
    client's conversation (a Jinja ``raise_exception``, an option it does not take) is a 400."""
    kwargs = dict(options)
    if tools:
        kwargs["tools"] = tools
    try:
        return str(template(messages, **kwargs))
    except DjlHandlersError:
        raise
    except Exception as exc:  # noqa: BLE001 - the model's template refused the client's messages
        where = "chat_template_kwargs" if options and isinstance(exc, TypeError) else "messages"
        raise InvalidRequest(f"the model's chat template cannot render these messages: {exc}", field=where) from None


def completion_to_lmi(body: dict[str, Any]) -> OpenAIRequest:
    """Validate a ``/v1/completions`` body."""
    _check_fields(body, COMPLETION)
    prompts = completion_prompts(body.get("prompt"))
    logprobs = body.get("logprobs")
    if logprobs is not None and not _int_in(logprobs, 0, MAX_COMPLETION_LOGPROBS):
        raise InvalidParameter(f"logprobs must be an integer in [0, {MAX_COMPLETION_LOGPROBS}], got {_show(logprobs)}",
                               field="logprobs")
    echo = _bool(body.get("echo"), "echo", False)
    prompt_only = body.get("max_tokens") == 0 and not isinstance(body.get("max_tokens"), bool)
    if prompt_only and not echo:
        raise InvalidParameter("max_tokens must be a positive integer (0 only with echo: the prompt alone), got 0",
                               field="max_tokens")
    # max_tokens 0 with echo: one token is decoded (the prompt's forward gives it) and not shown, as vLLM does
    params = _common_parameters({**body, "max_tokens": 1} if prompt_only else body, COMPLETION)
    if body.get("best_of") not in (None, 1):  # OpenAI returns n (default 1) of the best_of samples
        params.update(best_of=body["best_of"], n=params.get("n", 1))
        if "num_beams" in params:  # use_beam_search: best_of beams when more than n
            params["num_beams"] = max(params["num_beams"], params["best_of"])
        _check_greedy_samples(params, "best_of")
    if logprobs:
        params["top_n_tokens"] = logprobs  # each position's N most likely tokens
    if echo:
        params["return_full_text"] = True
        if logprobs is not None:
            params["decoder_input_details"] = True  # the prompt tokens' log-probs (and their top N)
    stream = _bool(body.get("stream"), "stream", False)
    options = replace(_options(body, logprobs=logprobs), echo=echo, prompt_only=prompt_only)
    first = prompts[0] if isinstance(prompts[0], str) else ""
    return OpenAIRequest(first, params, stream, "completion_sse" if stream else "completion_json", options,
                         add_special_tokens=_optional_bool(body, "add_special_tokens"), prompts=tuple(prompts))


def completion_prompts(value: Any) -> list[Prompt]:
    """The prompts of a completions body: a string, a list of token ids, or a non-empty list of
    strings or of token-id lists (one choice each, in order)."""
    if isinstance(value, str):
        check_text(value, "prompt")
        return [value]
    expected = "a string, a list of token ids, or a non-empty list of strings or of token-id lists"
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"prompt must be {expected}, got {_show(value)}", field="prompt")
    if isinstance(value[0], int) and not isinstance(value[0], bool):  # one prompt as token ids
        bad = next(i for i, v in enumerate(value + [-1]) if not _is_token_id(v))
        if bad < len(value):
            raise InvalidRequest(f"prompt[{bad}] must be a token id (a non-negative integer) like prompt[0], got "
                                 f"{_show(value[bad])}", field="prompt")
        return [tuple(value)]
    kind = str if isinstance(value[0], str) else list
    prompts: list[Prompt] = []
    for index, item in enumerate(value):
        if kind is str and isinstance(item, str):
            check_text(item, f"prompt[{index}]")
            prompts.append(item)
        elif kind is list and isinstance(item, list) and item and all(_is_token_id(v) for v in item):
            prompts.append(tuple(item))
        else:
            what = "a string" if kind is str else "a non-empty list of token ids (non-negative integers)"
            raise InvalidRequest(f"prompt[{index}] must be {what}, got {_show(item)}", field="prompt")
    return prompts


def with_prompts(request: Request, prompts: Sequence[Prompt]) -> Request:
    """``request`` for ``prompts``: its prompt (text, or token ids whose text the scheduler decodes),
    or, for several, one request per prompt in ``per_prompt``."""
    if not prompts:
        return request
    parts = tuple(replace(request, prompt=p, inputs=p) if isinstance(p, str)
                  else replace(request, prompt="", inputs=list(p), prompt_ids=p) for p in prompts)
    if len(parts) == 1:
        return parts[0]
    return replace(request, prompt="", inputs=[p.inputs for p in parts], per_prompt=parts)


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _common_parameters(body: dict[str, Any], api: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if body.get("n") is not None:
        params["n"] = body["n"]  # validated (and refused by engines without samples) as LMI's n
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is not None and not _int_in(max_tokens, 1, None):
        raise InvalidParameter(f"{key} must be a positive integer, got {_show(max_tokens)}", field=key)
    params["max_new_tokens"] = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else temperature
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        if not 0 <= temperature <= MAX_TEMPERATURE:
            raise InvalidParameter(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {temperature}",
                                   field="temperature")
        if temperature > 0:
            params.update(do_sample=True, temperature=temperature)
    else:
        raise InvalidParameter(f"temperature must be a number, got {_show(temperature)}", field="temperature")
    for spec in FIELDS[api].values():
        if spec.handling == PARAMETER and body.get(spec.name) is not None:
            assert spec.parameter is not None
            params[spec.parameter] = body[spec.name]
    params.update(_structured(body))
    if _bool(body.get("use_beam_search"), "use_beam_search", False):  # vLLM's: beam width n, greedy
        params.update(num_beams=params.get("n", 1), do_sample=False)
        params.pop("temperature", None)
    _check_greedy_samples(params, "n")
    return params


def _check_greedy_samples(params: dict[str, Any], name: str) -> None:
    """vLLM's rule, in its words: more than one sample (``n``/``best_of``) needs sampling."""
    value = params.get(name)
    beams = params.get("num_beams", 1)  # use_beam_search returns up to num_beams sequences
    if isinstance(value, int) and not isinstance(value, bool) and value > max(1, beams) and not params.get("do_sample"):
        raise InvalidParameter(f"{name} must be 1 when using greedy sampling (temperature 0), got {value}",
                               field=name)


def _in_body_terms(exc: InvalidParameter) -> InvalidParameter:
    """``exc`` (raised by ``GenerationParameters``) naming the OpenAI field the client sent
    (``ignore_eos``) instead of the LMI parameter it set (``parameters.ignore_eos_token``)."""
    message = exc.message
    for lmi in sorted({exc.field or "", *_BODY_NAMES}, key=len, reverse=True):
        if lmi:
            name = _BODY_NAMES.get(lmi, lmi)
            message = message.replace(f"parameters.{lmi}", name).replace(f"parameter {lmi} ", f"field {name} ")
    field_name = _BODY_NAMES.get(exc.field or "", exc.field)
    return type(exc)(message, field=field_name)


def _structured(body: dict[str, Any]) -> dict[str, Any]:
    """``response_format``, vLLM's ``structured_outputs`` and its top-level ``guided_*`` fields as
    LMI parameters (one at most; ``GenerationParameters`` checks each value)."""
    params = response_format(body.get("response_format"))
    given = [key for key in GUIDED if body.get(key) is not None]
    outputs = structured_outputs(body.get("structured_outputs"))
    for key in (*given, *outputs):
        if params or (key in outputs and given):
            raise InvalidParameter(f"{key} cannot be combined with response_format, structured_outputs or "
                                   "another guided_* field", field=key if key in given else "structured_outputs")
        params[key] = outputs.get(key, body.get(key))
    return params


def structured_outputs(value: Any) -> dict[str, Any]:
    """vLLM's ``structured_outputs`` object (``json``, ``regex``, ``choice``, ``grammar``,
    ``json_object``: exactly one) as an LMI ``guided_*`` parameter."""
    if value is None:
        return {}
    kinds = ("json", "regex", "choice", "grammar", "json_object")
    if not isinstance(value, dict) or set(value) - set(kinds):
        raise InvalidParameter(f"structured_outputs must be an object with one of {list(kinds)}",
                               field="structured_outputs")
    found = {f"guided_{k}": v for k, v in value.items() if v is not None and v is not False}
    if len(found) != 1:
        raise InvalidParameter(f"structured_outputs must set exactly one of {list(kinds)}", field="structured_outputs")
    return found


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
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise InvalidRequest(f"model must be a string, got {_show(body['model'])}", field="model")
    return ResponseOptions(model=str(body.get("model") or ""), logprobs=logprobs,
                           top_logprobs=top_logprobs,
                           include_usage=bool(stream_options and stream_options.get("include_usage")))


def _check_fields(body: dict[str, Any], api: str) -> None:
    """400 naming the first field the ``api`` route does not accept, or a ``default_only`` field
    (a feature we do not have) set to anything but its default."""
    fields = FIELDS[api]
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise InvalidRequest(f"unsupported field(s) {unknown}", field=unknown[0])
    for name, value in body.items():
        spec = fields[name]
        if spec.handling == DEFAULT_ONLY and value is not None and not _same(value, spec.default):
            default = "" if spec.default is None else f" (only its default, {json.dumps(spec.default)})"
            raise InvalidParameter(f"{name} is not supported{default}, got {_show(value)}", field=name)


def _same(value: Any, default: Any) -> bool:
    return type(value) is type(default) and value == default


def _int_in(value: Any, low: int, high: Optional[int]) -> bool:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    return ok and (high is None or value <= high)


def _bool(value: Any, name: str, default: bool) -> bool:
    """A JSON boolean; ``null`` (or absent) is ``default``."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidParameter(f"{name} must be true or false, got {_show(value)}", field=name)
    return value


def _optional_bool(body: dict[str, Any], name: str) -> Optional[bool]:
    value = body.get(name)
    return None if value is None else _bool(value, name, False)


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
