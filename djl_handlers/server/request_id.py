"""``x-request-id`` on every request, as DJL Serving 0.34's front end does (``Session.java``).

The id is the client's ``x-request-id`` header when it is 1-128 visible ASCII characters, else a
new UUID (DJL: ``UUID.randomUUID()``). It is put in the ASGI scope (``request.state.request_id``),
returned as the ``x-request-id`` response header of every HTTP response, carried to the worker as
DJL's ``requestId`` Input property, and appears in the log lines about the request and in OpenAI
``id`` fields (``chatcmpl-<id>``/``cmpl-<id>``).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

__all__ = ["HEADER", "RequestIdMiddleware", "request_id_of"]

HEADER = "x-request-id"
_HEADER_BYTES = HEADER.encode("ascii")
_VALID = re.compile(rb"[\x21-\x7e]{1,128}")


def request_id_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's id when it is acceptable, else a fresh UUID."""
    for name, value in headers:
        if name.lower() == _HEADER_BYTES and _VALID.fullmatch(value):
            return value.decode("ascii")
    return str(uuid.uuid4())


class RequestIdMiddleware:
    """Pure ASGI middleware: assign the id, echo it in the response head."""

    def __init__(self, app: Any) -> None:
        """Wrap ``app``."""
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Set ``scope["state"]["request_id"]`` and add the header to ``http.response.start``."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id_of(scope.get("headers") or [])
        scope.setdefault("state", {})["request_id"] = rid
        header = (_HEADER_BYTES, rid.encode("ascii"))

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers") or [] if h[0].lower() != _HEADER_BYTES]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        await self.app(scope, receive, send_with_id)
