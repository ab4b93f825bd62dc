"""Parse one DJL ``Input`` item (one client request) into a ``Request``.

The parser knows no engine and imports no ML library. Every problem raises an
``InvalidRequest`` subclass whose message names the field; the caller turns it into that
request's own error record, so a malformed request never harms its batch neighbours.

Accepted bodies: ``application/json`` (or no Content-Type) with ``inputs`` (string; a list of
strings in dynamic-batch mode), optional ``parameters`` object and ``stream`` boolean; and
``text/plain``, whose whole body is the prompt.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

from djl_handlers.lora.selection import AdapterNames, openai_adapter, select_adapters
from djl_handlers.errors import InvalidParameter, InvalidRequest, UnprocessableParameter, UnsupportedMediaType
from djl_handlers.extensions import API_PROPERTY
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.params.translate import is_sampling
from djl_handlers.request.bedrock import bedrock_to_lmi
from djl_handlers.request.openai import ChatTemplate, OpenAIRequest, chat_to_lmi, check_text, completion_to_lmi
from djl_handlers.request.records import FormatterFunction, Request

TOP_LEVEL_KEYS = ("inputs", "parameters", "stream", "adapters")
TGI_NULL_ONLY: tuple[str, ...] = ()  # TGI's grammar is structured output (params/structured.py)
META_PARAMETERS = ("stream", "output_formatter")

# A custom input formatter from model.py: (input item, settings) -> a JSON-like request body.
InputFormatter = Callable[..., Mapping[str, Any]]


@dataclass(frozen=True)
class ParserSettings:
    """What the parser needs from the model's configuration."""

    engine: str = "huggingface"
    rolling_batch: bool = True
    default_output_formatter: Union[str, FormatterFunction, None] = None
    tgi_compat: bool = False
    max_new_tokens_limit: int = 4096
    strict_parameters: bool = True
    input_formatter: Optional[InputFormatter] = None
    chat_template: Optional[ChatTemplate] = None
    bedrock_compat: bool = False
    adapters: Optional[AdapterNames] = None  # the service's adapter registry; None: LoRA disabled


def decode_body(item: Any) -> Any:
    """Decode the request body by its Content-Type into a JSON-like value."""
    raw = _body_bytes(item)
    ctype = (item.get_property("Content-Type") or "").split(";")[0].strip().lower()
    if not raw:
        raise InvalidRequest("request body is empty; send a JSON object with 'inputs'", field="body")
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"request body is not valid UTF-8 (byte {exc.start})", field="body") from None
    if ctype in ("", "application/json", "application/jsonlines") or ctype.endswith("+json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(
                f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                field="body",
            ) from None
        except RecursionError:
            raise InvalidRequest("request body JSON is nested too deeply", field="body") from None
        except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
            raise InvalidRequest(f"request body is not valid JSON: {exc}", field="body") from None
    if ctype.startswith("text/"):
        return {"inputs": text}
    raise UnsupportedMediaType(
        f"Content-Type '{ctype}' is not supported; use application/json or text/plain", field="Content-Type"
    )


def _body_bytes(item: Any) -> bytes:
    content = item.get_content()
    if content.is_empty():
        return b""
    value = content.get("data")
    if value is None:
        value = content.value_at(0)
    return bytes(value) if value is not None else b""


def parse_request(item: Any, settings: ParserSettings) -> Request:
    """Parse one Input item; raises ``InvalidRequest`` (with ``field``) on any problem."""
    if settings.input_formatter is not None:
        body: Any = settings.input_formatter(item, settings=settings)
    else:
        body = decode_body(item)
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"request body must be a JSON object with 'inputs', got {type(body).__name__}", field="body"
        )
    api = (item.get_property(API_PROPERTY) or "").strip().lower()
    if api == "chat" or (not api and "messages" in body and "inputs" not in body):
        body, picked = _openai_adapters(body, item, settings)
        return _openai_request(item, chat_to_lmi(body, settings.chat_template), settings, picked)
    if api == "completion" or (not api and not settings.bedrock_compat and "prompt" in body and "inputs" not in body):
        body, picked = _openai_adapters(body, item, settings)
        return _openai_request(item, completion_to_lmi(body), settings, picked)
    if api in ("tgi", "tgi_stream"):
        body = _tgi_body(body, stream=api == "tgi_stream")
    elif settings.bedrock_compat and "prompt" in body and "inputs" not in body:
        body = bedrock_to_lmi(body, item.get_property("X-Amzn-SageMaker-Forwarded-Api"))
    unknown = sorted(set(body) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise InvalidRequest(
            f"unknown request field(s) {unknown}; allowed: {list(TOP_LEVEL_KEYS)}", field=unknown[0]
        )
    inputs = _check_inputs(body.get("inputs"), settings.rolling_batch)
    params = body.get("parameters")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidParameter(f"parameters must be a JSON object, got {type(params).__name__}", field="parameters")
    params = dict(params)
    stream = _check_bool(body.get("stream", params.pop("stream", False)), "stream")
    formatter = params.pop("output_formatter", None) or settings.default_output_formatter
    if formatter is not None and not isinstance(formatter, str) and not callable(formatter):
        raise InvalidParameter("parameters.output_formatter must be a string", field="output_formatter")
    gen = _generation_parameters(item, params, settings)
    prompt = inputs if isinstance(inputs, str) else inputs[0]
    count = 1 if isinstance(inputs, str) else len(inputs)
    adapters = select_adapters(body.get("adapters"), item, count, settings.adapters)
    return Request(
        prompt=prompt,
        params=gen,
        stream=stream,
        output_formatter=formatter,
        inputs=inputs,
        seed=gen.seed if is_sampling(gen) else None,
        properties=dict(item.get_properties()),
        adapters=adapters,
    )


def _openai_adapters(
    body: dict[str, Any], item: Any, settings: ParserSettings
) -> tuple[dict[str, Any], tuple[Optional[str], ...]]:
    """The body without ``adapters``, and the adapter chosen by ``adapters``, the SageMaker header
    or ``model`` (``"base:adapter"`` or an adapter's name)."""
    rest = {k: v for k, v in body.items() if k != "adapters"}
    picked = select_adapters(body.get("adapters"), item, 1, settings.adapters)
    if not picked:
        by_model = openai_adapter(body.get("model"), settings.adapters)
        picked = (by_model,) if by_model else ()
    return rest, picked


def _openai_request(item: Any, req: OpenAIRequest, settings: ParserSettings,
                    adapters: tuple[Optional[str], ...] = ()) -> Request:
    gen = _generation_parameters(item, req.parameters, settings)
    extra = dict(req.extra)
    if adapters and adapters[0]:
        extra["model"] = adapters[0]  # the response names the adapter that answered
    return Request(prompt=req.prompt, params=gen, stream=req.stream, output_formatter=req.formatter,
                   inputs=req.prompt, seed=gen.seed if is_sampling(gen) else None,
                   properties=dict(item.get_properties()), extra=extra, adapters=adapters)


def _generation_parameters(item: Any, params: dict[str, Any], settings: ParserSettings) -> GenerationParameters:
    gen = GenerationParameters.from_dict(
        params, settings.engine, max_new_tokens_limit=settings.max_new_tokens_limit, strict=settings.strict_parameters
    )
    seed = resolve_seed(gen, _server_seed(item))
    return gen if seed == gen.seed else replace(gen, seed=seed)


def resolve_seed(params: GenerationParameters, server_seed: Optional[int]) -> Optional[int]:
    """The request's seed, decided once: a sampling request uses the client's ``seed``, else the
    seed DJL's front end sent with the request, else a random one; a greedy request keeps only
    what the client sent (it decides nothing). ``Request.seed`` is this value when sampling and
    None when greedy, so replies report no seed for greedy decoding (as TGI does)."""
    if params.seed is not None or not is_sampling(params):
        return params.seed
    return server_seed if server_seed is not None else random.randrange(1 << 31)


def _tgi_body(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """A TGI ``/generate`` body in LMI terms: TGI's parameter names, TGI's output shapes."""
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidParameter("parameters must be a JSON object", field="parameters")
    unknown = sorted(set(body) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise InvalidRequest(f"unknown request field(s) {unknown}; allowed: {list(TOP_LEVEL_KEYS)}", field=unknown[0])
    if "inputs" in body and not isinstance(body["inputs"], str):
        raise InvalidRequest(f"inputs must be a string (TGI), got {type(body['inputs']).__name__}", field="inputs")
    params = dict(params)  # TGI's `stop` is an accepted alias of stop_sequences (from_dict checks both)
    adapter_id = params.pop("adapter_id", None)  # TGI's LoRA selection = our top-level "adapters"
    for key in TGI_NULL_ONLY:
        if params.pop(key, None) is not None:
            raise InvalidParameter(f"parameters.{key} is not supported", field=key)
    _tgi_check_temperature(params.get("temperature"))
    if params.pop("watermark", False):
        raise InvalidParameter("parameters.watermark is not supported", field="watermark")
    if params.get("best_of") in (None, 1):
        params.pop("best_of", None)
    if params.get("top_n_tokens") in (None, 0):
        params.pop("top_n_tokens", None)
    if not params.get("decoder_input_details"):
        params.pop("decoder_input_details", None)
    stream = stream or _check_bool(body.get("stream", False), "stream")
    if stream and params.get("decoder_input_details"):  # as TGI: prefill details are never streamed
        raise InvalidParameter("decoder_input_details is not supported when streaming tokens",
                               field="decoder_input_details")
    params["output_formatter"] = "tgi_stream" if stream else "tgi"
    tgi = {"inputs": body.get("inputs"), "parameters": params, "stream": stream}
    if adapter_id is not None or body.get("adapters") is not None:
        tgi["adapters"] = adapter_id if adapter_id is not None else body.get("adapters")
    return tgi


def _tgi_check_temperature(value: Any) -> None:
    """TGI's router refuses ``temperature <= 0`` (422) where the LMI schema means greedy by 0."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and value <= 0:
        raise UnprocessableParameter("`temperature` must be strictly positive", field="temperature")


def _check_inputs(value: Any, rolling: bool) -> Union[str, list[str]]:
    if value is None:
        raise InvalidRequest("missing required field 'inputs'", field="inputs")
    if isinstance(value, str):
        return check_text(value, "inputs")
    if isinstance(value, list) and not rolling:
        if not value:
            raise InvalidRequest("inputs must not be an empty list", field="inputs")
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise InvalidRequest(f"inputs[{i}] must be a string, got {type(v).__name__}", field="inputs")
            check_text(v, "inputs")
        return list(value)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        # DJL's own integration client (tests/integration/llm/client.py) sends {"inputs": [prompt]}
        # to rolling-batch models: one prompt in a list is that prompt (DJL 0.34 answers 424).
        return check_text(value[0], "inputs")
    if isinstance(value, list):
        raise InvalidRequest(
            f"inputs must be a string (or a one-element list) with rolling batch, got a list of {len(value)}; "
            "send one request per prompt (lists of several prompts need option.rolling_batch=disable)",
            field="inputs",
        )
    raise InvalidRequest(f"inputs must be a string, got {type(value).__name__}", field="inputs")


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false, got {json.dumps(value)}", field=name)
    return value


def _server_seed(item: Any) -> Optional[int]:
    """The random seed DJL's Java side adds as content ``seed`` on a request's first step."""
    content = item.get_content()
    value = content.get("seed")
    if value is None:
        return None
    try:
        seed = int(bytes(value).decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return seed % (1 << 32)  # Java sends a random signed int; fold it into the unsigned range
