"""Formatter registry: a name (or a custom callable from model.py) -> ``Formatter``, over every API
dialect (LMI's own formats in ``formatting``; TGI, OpenAI and Bedrock in their dialect packages).

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

from collections.abc import Callable
from typing import Any, Optional, Union

from djl_handlers.dialects.bedrock.response import ThreePFormatter, ThreePStreamFormatter
from djl_handlers.dialects.openai.response import OpenAIJsonFormatter, OpenAIStreamFormatter
from djl_handlers.dialects.openai.tool_stream import ToolStreamFormatter
from djl_handlers.dialects.tgi.response import TgiFormatter, TgiStreamFormatter
from djl_handlers.errors import ConfigError, InvalidRequest
from djl_handlers.formatting.base import Formatter
from djl_handlers.formatting.custom import CustomFormatter
from djl_handlers.formatting.lmi import JsonFormatter, JsonLinesFormatter, NoneFormatter, dumps
from djl_handlers.formatting.sse import SseFormatter

__all__ = ["FORMATTERS", "allowed_names", "content_type_for", "error_formatter", "get_formatter", "resolve_name"]

FormatterSpec = Union[str, Callable[..., Any], None]
Factory = Callable[[], Formatter]


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
    "chat_tools_sse": ToolStreamFormatter,
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
_ERROR_FORMATTERS = {"tgi": "tgi", "tgi_stream": "tgi_stream", "chat": "chat_json", "completion": "completion_json",
                     "embeddings": "completion_json", "rerank": "completion_json", "score": "completion_json"}


def error_formatter(api: Optional[str]) -> Formatter:
    """The formatter that renders errors for an unparsed request of API dialect ``api``."""
    return get_formatter(_ERROR_FORMATTERS.get((api or "").strip().lower(), "json"), stream=False)


def content_type_for(spec: FormatterSpec, stream: bool, tgi_compat: bool = False, *, config: bool = False) -> str:
    """Content-Type of the body that ``spec`` produces (the formatter's own ``content_type``)."""
    return get_formatter(spec, stream=stream, tgi_compat=tgi_compat, config=config).content_type
