"""The LMI request: one DJL ``Input`` item's body, and an LMI-schema body turned into a ``Request``.

The parser knows no engine and imports no ML library. Every problem raises an
``InvalidRequest`` subclass whose message names the field; the caller turns it into that
request's own error record, so a malformed request never harms its batch neighbours.

Accepted bodies: ``application/json`` (or no Content-Type) with ``inputs`` (string; a list of
strings in dynamic-batch mode), optional ``parameters`` object and ``stream`` boolean; and
``text/plain``, whose whole body is the prompt. The other API dialects (TGI, OpenAI, Bedrock) turn
their bodies into this schema (``djl_handlers.dialects``; ``dialects.dispatch.parse_request`` picks
the dialect of an item).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

from djl_handlers.errors import InvalidParameter, InvalidRequest, UnsupportedMediaType
from djl_handlers.lora.selection import AdapterNames, select_adapters
from djl_handlers.media.markdown import inline_images
from djl_handlers.media.records import ImageRef
from djl_handlers.media.refs import check_image_count
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.params.translate import is_sampling
from djl_handlers.request.records import FormatterFunction, Request

TOP_LEVEL_KEYS = ("inputs", "parameters", "stream", "adapters")
META_PARAMETERS = ("stream", "output_formatter")

# A custom input formatter from model.py: (input item, settings) -> a JSON-like request body.
InputFormatter = Callable[..., Mapping[str, Any]]
# The model's chat template: ``template(messages, tools=None) -> prompt``; a ``reads_tools``
# attribute set to True says the template renders ``tools`` itself (otherwise the OpenAI dialect
# describes them in a system message).
ChatTemplate = Callable[..., str]


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
    reasoning_parser: Optional[str] = None  # option.reasoning_parser (parsers.registry); None: not split
    tool_call_parser: str = "json"  # the parser of tool_choice auto replies (option.tool_call_parser)
    image_limit: int = 0  # images a prompt may carry (option.limit_mm_per_prompt); 0: the model takes text only
    image_placeholder: str = ""  # the model's image placeholder text (TGI's inline images in inputs)


def decode_body(item: Any) -> Any:
    """Decode the request body by its Content-Type into a JSON-like value."""
    raw = _body_bytes(item)
    ctype = (item.get_property("Content-Type") or "").split(";")[0].strip().lower()
    is_json = ctype in ("", "application/json", "application/jsonlines") or ctype.endswith("+json")
    if not is_json and not ctype.startswith("text/"):  # first: DJL's front end consumes form bodies
        raise UnsupportedMediaType(
            f"Content-Type '{ctype}' is not supported; use application/json or text/plain", field="Content-Type"
        )
    if not raw:
        raise InvalidRequest("request body is empty; send a JSON object with 'inputs'", field="body")
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"request body is not valid UTF-8 (byte {exc.start})", field="body") from None
    if is_json:
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
    return {"inputs": text}  # text/*: the body is the prompt


def _body_bytes(item: Any) -> bytes:
    content = item.get_content()
    if content.is_empty():
        return b""
    value = content.get("data")
    if value is None:
        value = content.value_at(0)
    return bytes(value) if value is not None else b""


def read_body(item: Any, settings: ParserSettings) -> dict[str, Any]:
    """The item's body as a JSON object: the custom input formatter's result, else the decoded body."""
    if settings.input_formatter is not None:
        body: Any = settings.input_formatter(item, settings=settings)
    else:
        body = decode_body(item)
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"request body must be a JSON object with 'inputs', got {type(body).__name__}", field="body"
        )
    return body


def lmi_request(item: Any, body: dict[str, Any], settings: ParserSettings) -> Request:
    """An LMI-schema body (``inputs``, ``parameters``, ``stream``, ``adapters``) as a ``Request``."""
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
    stream = check_bool(body.get("stream", params.pop("stream", False)), "stream")
    formatter = params.pop("output_formatter", None) or settings.default_output_formatter
    if formatter is not None and not isinstance(formatter, str) and not callable(formatter):
        raise InvalidParameter("parameters.output_formatter must be a string", field="output_formatter")
    gen = generation_parameters(item, params, settings)
    media: tuple[ImageRef, ...] = ()
    if isinstance(inputs, str) and settings.image_limit and settings.image_placeholder:
        inputs, media = inline_images(inputs, settings.image_placeholder)  # TGI's ![](url) links
        check_image_count(media, settings.image_limit)
    prompt = inputs if isinstance(inputs, str) else inputs[0]
    count = 1 if isinstance(inputs, str) else len(inputs)
    adapters = select_adapters(body.get("adapters"), item, count, settings.adapters)
    return Request(
        media=media,
        prompt=prompt,
        params=gen,
        stream=stream,
        output_formatter=formatter,
        inputs=inputs,
        seed=gen.seed if is_sampling(gen) else None,
        properties=dict(item.get_properties()),
        adapters=adapters,
    )


def generation_parameters(item: Any, params: dict[str, Any], settings: ParserSettings) -> GenerationParameters:
    """Validated ``GenerationParameters`` for an LMI ``parameters`` dict, with the request's seed
    decided (:func:`resolve_seed`)."""
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


def check_text(value: str, name: str) -> str:
    """Reject strings that are not valid Unicode text (lone surrogates from JSON escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{name} contains an invalid character at position {exc.start} "
                             "(a lone UTF-16 surrogate)", field=name) from None
    return value


def check_bool(value: Any, name: str) -> bool:
    """``value`` when it is a JSON boolean, else ``InvalidRequest`` naming ``name``."""
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
