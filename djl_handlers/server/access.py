"""Who may call the local server: an API key and CORS (both off by default).

* **API key** (``--api-key`` or env ``DJL_HANDLERS_API_KEY``): every request must carry
  ``Authorization: Bearer <key>``, compared in constant time (``hmac.compare_digest``); otherwise
  401 with ``WWW-Authenticate: Bearer`` and a body in the route's dialect — OpenAI's error object
  on ``/v1/*``, ``/tokenize``, ``/detokenize``; TGI's ``{"error", "error_type"}`` on ``/generate``,
  ``/generate_stream``, ``/`` and ``/info``; DJL's ``{"code", "type", "message"}`` elsewhere. The
  probes ``/health``, ``/ping`` and ``/metrics`` stay open unless ``--protect-probes``.
* **CORS** (``--allowed-origins``, comma-separated, ``*`` for any): Starlette's ``CORSMiddleware``;
  no CORS headers at all without it.

This is the local server only: under DJL Serving the Java front end owns access control.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from djl_handlers.dialects.openai.response import openai_error_object
from djl_handlers.dialects.tgi.response import tgi_error_object
from djl_handlers.server.sink import error_json

__all__ = ["API_KEY_ENV", "PROBES", "AccessSettings", "ApiKeyMiddleware", "access_middleware", "dialect_of_path"]

API_KEY_ENV = "DJL_HANDLERS_API_KEY"
PROBES = frozenset({"/health", "/ping", "/metrics"})
_OPENAI_PATHS = ("/v1/", "/tokenize", "/detokenize")
_TGI_PATHS = frozenset({"/generate", "/generate_stream", "/", "/info"})
_MESSAGE = "missing or wrong API key: send the header 'Authorization: Bearer <key>'"


@dataclass(frozen=True)
class AccessSettings:
    """The server's access rules (``djl-handlers serve`` flags)."""

    api_key: str | None = None
    protect_probes: bool = False
    allowed_origins: tuple[str, ...] = ()


def dialect_of_path(path: str) -> str:
    """The API dialect whose error shape a route answers in: ``openai``, ``tgi`` or ``djl``."""
    if path.startswith(_OPENAI_PATHS[0]) or path in _OPENAI_PATHS[1:]:
        return "openai"
    return "tgi" if path in _TGI_PATHS else "djl"


def unauthorized_body(path: str) -> bytes:
    """The 401 body in the dialect of ``path``."""
    dialect = dialect_of_path(path)
    if dialect == "openai":
        return json.dumps(openai_error_object(401, _MESSAGE, None, "invalid_request_error")).encode("utf-8")
    if dialect == "tgi":
        return json.dumps(tgi_error_object(401, _MESSAGE, "unauthorized")).encode("utf-8")
    return error_json(401, "UnauthorizedException", _MESSAGE)


def _bearer(headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


class ApiKeyMiddleware:
    """Pure ASGI middleware: 401 unless ``Authorization: Bearer <key>`` (constant-time compare)."""

    def __init__(self, app: Any, api_key: str, open_paths: frozenset[str] = PROBES) -> None:
        """Wrap ``app``; ``open_paths`` need no key."""
        self.app = app
        self.key = api_key.encode("utf-8")
        self.open_paths = open_paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Pass an authorized (or open-path) request on; answer 401 otherwise."""
        if scope["type"] != "http" or scope.get("path", "") in self.open_paths:
            await self.app(scope, receive, send)
            return
        token = _bearer(scope.get("headers") or [])
        if token is not None and hmac.compare_digest(token, self.key):
            await self.app(scope, receive, send)
            return
        body = unauthorized_body(scope.get("path", ""))
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii")),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


def access_middleware(access: AccessSettings | None) -> list[Middleware]:
    """The middleware ``access`` asks for, outermost first: CORS (so that browsers' preflight
    requests, which carry no key, are answered), then the API key."""
    if access is None:
        return []
    stack: list[Middleware] = []
    if access.allowed_origins:
        stack.append(Middleware(CORSMiddleware, allow_origins=list(access.allowed_origins), allow_methods=["*"],
                                allow_headers=["*"], expose_headers=["x-request-id"]))
    if access.api_key:
        open_paths = frozenset() if access.protect_probes else PROBES
        stack.append(Middleware(ApiKeyMiddleware, api_key=access.api_key, open_paths=open_paths))
    return stack
