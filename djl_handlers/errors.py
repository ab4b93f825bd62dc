"""One exception tree for the whole project; each class carries its HTTP status.

Every error a user can cause is a ``DjlHandlersError`` subclass carrying an HTTP status code
and a message that names the offending field or key. ``error_body`` renders DJL's ``Output.error``
body for it and ``record_error_body`` DJL's rendering of a failed rolling-batch record; errors in
an API dialect (TGI, OpenAI, ...) are rendered by that dialect's formatter.
"""

from __future__ import annotations

import json
from typing import Any


class DjlHandlersError(Exception):
    """Base class. ``status`` is the HTTP status code a client sees for this error."""

    status: int = 500
    kind: str = "internal_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidRequest(DjlHandlersError):
    """The request body cannot be understood (bad JSON, wrong shape, wrong content type)."""

    status = 400
    kind = "invalid_request"


class InvalidParameter(InvalidRequest):
    """A generation parameter has a wrong type or an out-of-range value."""

    kind = "invalid_parameter"


class UnprocessableParameter(InvalidParameter):
    """A parameter value an API dialect refuses although the LMI schema accepts it (TGI's router
    answers 422 with ``error_type`` ``validation``, e.g. ``temperature: 0``)."""

    status = 422
    kind = "validation"


class PromptTooLong(InvalidRequest):
    """The prompt (plus max_new_tokens) does not fit the model's context."""

    kind = "prompt_too_long"


class UnsupportedMediaType(InvalidRequest):
    """The request's Content-Type cannot be decoded."""

    status = 415
    kind = "unsupported_media_type"


class ConfigError(DjlHandlersError):
    """serving.properties / OPTION_* configuration is invalid. Fails the init call."""

    status = 500
    kind = "config_error"


class EngineNotInstalled(ConfigError):
    """The engine library for the configured entry point is not importable."""

    kind = "engine_not_installed"


class EngineError(DjlHandlersError):
    """The engine failed while serving a request (DJL maps this to 424)."""

    status = 424
    kind = "engine_error"


class EngineOutOfMemory(EngineError):
    """The engine ran out of memory (DJL's 507)."""

    status = 507
    kind = "out_of_memory"


def status_of(exc: BaseException) -> int:
    """HTTP status for any exception: our own tree's ``status``, DJL's 507 for out-of-memory
    (``MemoryError``, torch's ``OutOfMemoryError``), else DJL's 424."""
    if isinstance(exc, DjlHandlersError):
        return exc.status
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return 507
    return 424


def safe_text(text: str) -> str:
    """``text`` with anything UTF-8 cannot encode (lone surrogates) escaped, so it can be sent."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def message_of(exc: BaseException) -> str:
    """A non-empty, sendable message for any exception (DJL v0.27 sometimes sent empty ones)."""
    text = safe_text(str(exc).strip())
    return text if text else type(exc).__name__


def error_body(exc: BaseException) -> dict[str, Any]:
    """The JSON body for an error: ``{"code", "message", "error"}`` as DJL's ``Output.error``,
    plus ``type`` (and ``field`` when known) so clients can react without parsing text."""
    field = safe_text(exc.field) if isinstance(exc, DjlHandlersError) and exc.field else None
    kind = exc.kind if isinstance(exc, DjlHandlersError) else "engine_error"
    return output_error_body(status_of(exc), message_of(exc), kind, field)


def output_error_body(code: int, error: str, kind: str = "engine_error", field: str | None = None) -> dict[str, Any]:
    """DJL's ``Output.error`` body ``{"code", "message", "error", "type"[, "field"]}`` for ``code``."""
    body: dict[str, Any] = {
        "code": code,
        "message": "invalid request" if 400 <= code < 500 and code != 424 else "prediction failure",
        "error": error,
        "type": kind,
    }
    if field:
        body["field"] = field
    return body


def record_error_body(code: int | None, error: str | None) -> str:
    """DJL's front-end rendering of a rolling-batch record carrying ``code``: compact
    ``{"error":..,"code":..}``, ``error`` first (observed with DJL 0.34)."""
    body: dict[str, Any] = {}
    if error is not None:
        body["error"] = error
    body["code"] = code
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)
