"""Formatter registry: a name (or a custom callable from model.py) -> ``Formatter``.

Resolution (``get_formatter``):

- ``None``/``""``: ``jsonlines`` when streaming, else ``json``; with ``tgi_compat``:
  ``tgi_stream`` when streaming, else ``tgi``.
- a registered name (case-insensitive, surrounding blanks ignored). With ``tgi_compat`` the
  names ``json`` and ``sse`` mean ``tgi`` and ``tgi_stream``.
- a callable: wrapped by ``CustomFormatter``.
- anything else: ``InvalidRequest`` (or ``ConfigError`` with ``config=True``) naming the value and
  the allowed names. v0.27 logged a warning and fell back to the default; we do not.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Optional, Union

from djl_handlers.errors import ConfigError, InvalidRequest
from djl_handlers.formatting.lmi import (
    Formatter,
    JsonFormatter,
    JsonLinesFormatter,
    NoneFormatter,
    dumps,
    error_message,
    finish_reason,
    inputs_of,
    is_error,
    lmi_token,
    step_events,
    wants_details,
)
from djl_handlers.formatting.openai import OpenAIJsonFormatter, OpenAIStreamFormatter
from djl_handlers.formatting.sse import SseFormatter
from djl_handlers.formatting.tgi import TgiFormatter, TgiStreamFormatter
from djl_handlers.formatting.three_p import ThreePFormatter, ThreePStreamFormatter
from djl_handlers.request.records import RequestOutput, Token

FormatterSpec = Union[str, Callable[..., Any], None]
Factory = Callable[[], Formatter]

def _tool_stream() -> Formatter:
    from djl_handlers.formatting.tools import ToolStreamFormatter

    return ToolStreamFormatter()


# name -> factory; each formatter declares its own ``content_type`` (the one place it is written).
FORMATTERS: dict[str, Factory] = {
    "json": JsonFormatter,
    "jsonlines": JsonLinesFormatter,
    "none": NoneFormatter,
    "sse": SseFormatter,
    "tgi": TgiFormatter,
    "tgi_stream": TgiStreamFormatter,
    "3p": ThreePFormatter,
    "3p_stream": ThreePStreamFormatter,
    "chat_json": lambda: OpenAIJsonFormatter("chat_json", "chat"),
    "chat_sse": lambda: OpenAIStreamFormatter("chat_sse", "chat"),
    "completion_json": lambda: OpenAIJsonFormatter("completion_json", "completion"),
    "completion_sse": lambda: OpenAIStreamFormatter("completion_sse", "completion"),
    "sse_chat": lambda: OpenAIStreamFormatter("sse_chat", "chat"),
    # DJL v0.27's chat names keep DJL's spaced JSON separators.
    "json_chat": lambda: OpenAIJsonFormatter("json_chat", "chat", dump=dumps),
    "jsonlines_chat": lambda: OpenAIStreamFormatter("jsonlines_chat", "chat", sse=False, dump=dumps),
    "chat_tools_sse": _tool_stream,
}
TGI_ALIASES = {"json": "tgi", "sse": "tgi_stream"}


def allowed_names() -> list[str]:
    """Every registered formatter name, sorted."""
    return sorted(FORMATTERS)


def resolve_name(spec: Optional[str], *, stream: bool, tgi_compat: bool = False, config: bool = False) -> str:
    """The registered name a string spec (or None) stands for; raises for unknown names."""
    name = (spec or "").strip().lower()
    if not name:
        name = "jsonlines" if stream else "json"
        if tgi_compat:
            name = "tgi_stream" if stream else "tgi"
    elif tgi_compat:
        name = TGI_ALIASES.get(name, name)
    if name not in FORMATTERS:
        error = ConfigError if config else InvalidRequest
        raise error(
            f"unknown output_formatter {spec!r}; allowed: {', '.join(allowed_names())} "
            "or a callable defined in model.py",
            field="output_formatter",
        )
    return name


def get_formatter(spec: FormatterSpec, *, stream: bool, tgi_compat: bool = False, config: bool = False) -> Formatter:
    """The formatter for ``spec`` (name, custom callable, or None for the default)."""
    if callable(spec):
        return CustomFormatter(spec, stream=stream)
    if spec is not None and not isinstance(spec, str):
        error = ConfigError if config else InvalidRequest
        raise error(
            f"output_formatter must be a name or a callable, got {type(spec).__name__} {spec!r}",
            field="output_formatter",
        )
    return FORMATTERS[resolve_name(spec, stream=stream, tgi_compat=tgi_compat, config=config)]()


# The formatter whose error rendering a request of each API dialect (set by the server's routes)
# gets when it fails before it could be parsed; anything else gets DJL's LMI rendering.
_ERROR_FORMATTERS = {"tgi": "tgi", "tgi_stream": "tgi_stream", "chat": "chat_json", "completion": "completion_json"}


def error_formatter(api: Optional[str]) -> Formatter:
    """The formatter that renders errors for an unparsed request of API dialect ``api``."""
    return get_formatter(_ERROR_FORMATTERS.get((api or "").strip().lower(), "json"), stream=False)


def content_type_for(spec: FormatterSpec, stream: bool, tgi_compat: bool = False, *, config: bool = False) -> str:
    """Content-Type of the body that ``spec`` produces (the formatter's own ``content_type``)."""
    return get_formatter(spec, stream=stream, tgi_compat=tgi_compat, config=config).content_type


# --------------------------------------------------------------------------- custom formatters


def is_legacy_formatter(fn: Callable[..., Any]) -> bool:
    """True for DJL v0.27's ``fn(token, first_token, last_token, details, generated_text, id)``.

    Detected by six required positional parameters, or a first parameter annotated ``Token``
    (DJL v0.29's rule).
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    if len(required) >= 6:
        return True
    if not positional:
        return False
    annotation = positional[0].annotation
    label = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return str(label).strip("'\"").rsplit(".", 1)[-1] == "Token"


@dataclasses.dataclass
class LegacyToken:
    """The token object a v0.27 formatter receives: ``id`` is a one-element list."""

    id: list[int]
    text: str
    log_prob: Optional[float]
    special_token: Optional[bool]
    request_id: Any

    def as_dict(self) -> dict[str, Any]:
        """LMI token dict, as ``Token.as_dict()`` in v0.27."""
        return lmi_token(Token(self.id[0], self.text, self.log_prob, bool(self.special_token)))


def _params_dict(params: Any) -> dict[str, Any]:
    to_dict = getattr(params, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        return dataclasses.asdict(params)
    return dict(getattr(params, "__dict__", {}))


def legacy_details(out: RequestOutput, index: int, closing: bool) -> dict[str, Any]:
    """The ``details`` dict v0.27 passed to custom formatters for token ``index``."""
    if wants_details(out):
        seen = out.tokens[: index + 1]
        return {
            "finish_reason": finish_reason(out) if closing else None,
            "tokens": [lmi_token(t) for t in seen],
            "generated_tokens": len(seen),
            "inputs": inputs_of(out),
            "parameters": _params_dict(out.request.params),
            "prompt_tokens": out.prompt_tokens,
        }
    if closing and is_error(out):
        return {"finish_reason": "error", "error": error_message(out)}
    return {}


class CustomFormatter(Formatter):
    """Wraps a formatter function from model.py.

    New style: ``fn(out: RequestOutput) -> str``, called once per step. Legacy v0.27 style (see
    ``is_legacy_formatter``): called once per new token (and once with an empty id -1 token when
    a finishing step has none), results concatenated. Content type: the function's
    ``content_type`` attribute, else ``application/jsonlines`` when streaming, else
    ``application/json``. ``None`` results count as ``""``; bytes are decoded as UTF-8.
    """

    def __init__(self, fn: Callable[..., Any], *, stream: bool) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", type(fn).__name__)
        self.content_type = self.content_type_of(fn, stream=stream)
        self.legacy = is_legacy_formatter(fn)

    @staticmethod
    def content_type_of(fn: Callable[..., Any], *, stream: bool) -> str:
        """The Content-Type a custom formatter declares, or the default."""
        declared = getattr(fn, "content_type", None)
        if isinstance(declared, str) and declared:
            return declared
        return "application/jsonlines" if stream else "application/json"

    def __call__(self, out: RequestOutput) -> str:
        if not self.legacy:
            return self._text(self.fn(out))
        prefix = out.full_text[: len(out.full_text) - len(out.generated_text)]
        request_id = out.request.extra.get("request_id", 0)
        parts = []
        for index, token, closing in step_events(out):
            legacy = LegacyToken([token.id], token.text, token.log_prob, token.special or None, request_id)
            details = legacy_details(out, index, closing)
            generated = out.full_text if closing else prefix
            parts.append(self._text(self.fn(legacy, index == 0, closing, details, generated, request_id)))
        return "".join(parts)

    def _text(self, result: Any) -> str:
        if result is None:
            return ""
        if isinstance(result, str):
            return result
        if isinstance(result, (bytes, bytearray)):
            return bytes(result).decode("utf-8")
        raise ConfigError(f"custom output_formatter {self.name!r} returned {type(result).__name__}; it must return str")
