"""Custom output formatters from model.py: ``CustomFormatter`` wraps a function, new style
(``fn(out: RequestOutput) -> str``, once per step) or DJL v0.27's legacy six-argument style (once per
token, see ``is_legacy_formatter``)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Optional

from djl_handlers.errors import ConfigError
from djl_handlers.formatting.base import Formatter
from djl_handlers.formatting.lmi import (
    error_message,
    finish_reason,
    inputs_of,
    is_error,
    lmi_token,
    step_events,
    wants_details,
)
from djl_handlers.request.records import RequestOutput, Token

__all__ = ["CustomFormatter", "LegacyToken", "is_legacy_formatter", "legacy_details"]


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
        request_id = out.request.legacy_id
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
