"""An in-process emulation of DJL Serving's async mode (``PythonAsyncEngine`` + Java's
``AsyncRequestManager``), for tests and tools.

:class:`AsyncModeClient` awaits ``handle`` the way DJL's Python async engine does (the init call
first, then one call per request tagged ``request_tracking_id``; a returned async generator is
drained) and builds each answer the way Java's ``Request.addResponse`` does: reply properties become
headers, the records' ``data`` the body, a record's ``code`` the status with body
``{"error","code"}``, and a non-200 ``Output`` an ``Async Inference Failure`` body.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from djl_handlers.errors import record_error_body
from djl_handlers.extensions import CANCEL_PROPERTY, CANCEL_TRACKING_PREFIX, TRACKING_ID_PROPERTY
from djl_handlers.io.inputs import Input
from djl_handlers.io.wire import binary_decode

__all__ = ["AsyncAnswer", "AsyncModeClient"]

Handler = Callable[[Any], Any]


@dataclass
class AsyncAnswer:
    """What a client of DJL's front end receives for one async-mode request."""

    code: int = 200
    chunks: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    records: list[dict[str, str]] = field(default_factory=list)
    error: Optional[str] = None
    done: bool = False

    @property
    def text(self) -> str:
        """The HTTP body."""
        return "".join(self.chunks)

    def json(self) -> Any:
        return json.loads(self.text)


class AsyncModeClient:
    """Drives ``handle`` in async mode (see the module docstring)."""

    def __init__(self, handle: Handler) -> None:
        self.handle = handle

    async def init(self, options: Mapping[str, str]) -> Any:
        """The init call (empty content, the model's options as properties, ``async_mode=true``)."""
        props = {"async_mode": "true", **options}
        return await _awaited(self.handle(Input.from_parts(props, [])))

    async def request(self, body: Any, tracking_id: Optional[str] = None,
                      **properties: str) -> AsyncAnswer:
        """One request; ``body`` a JSON value (or bytes). Returns the answer when it is complete."""
        answer = AsyncAnswer()
        await self.stream(body, answer, tracking_id, **properties)
        return answer

    async def stream(self, body: Any, answer: AsyncAnswer, tracking_id: Optional[str] = None,
                     **properties: str) -> None:
        """Like :meth:`request`, filling ``answer`` as replies arrive (a caller may watch it)."""
        data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode("utf-8")
        props = {"Content-Type": "application/json", TRACKING_ID_PROPERTY: tracking_id or str(uuid.uuid4()),
                 **properties}
        result = await _awaited(self.handle(Input.from_parts(props, [("data", bytes(data))])))
        if result is None:
            answer.code, answer.done = 204, True
            return
        if inspect.isasyncgen(result):
            async for output in result:
                if _apply(answer, output):
                    return
            return
        _apply(answer, result)

    async def cancel(self, tracking_id: str) -> Any:
        """Our front end's cancel frame for request ``tracking_id``."""
        props = {CANCEL_PROPERTY: tracking_id, TRACKING_ID_PROPERTY: f"{CANCEL_TRACKING_PREFIX}{uuid.uuid4()}"}
        return await _awaited(self.handle(Input.from_parts(props, [("data", b"")])))


async def _awaited(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    raise TypeError(f"object {type(value).__name__} can't be used in 'await' expression")


def _apply(answer: AsyncAnswer, output: Any) -> bool:
    """Java's ``AsyncRequestManager.addOutput`` for one reply; True once the answer is complete."""
    if answer.done:
        return True
    if output.code != 200:
        answer.code, answer.done = output.code, True
        answer.chunks = [json.dumps({"code": output.code, "message": f"Async Inference Failure {output.message}"})]
        return True
    answer.headers.update({str(k): str(v) for k, v in output.properties.items()})
    record = binary_decode(bytes(output.content.value_at(0)))
    answer.records.append(record)
    last = record.get("last", "").lower() == "true"
    data = record.get("data", "")
    if not data and not last:
        return False
    if "code" in record:
        answer.code = int(record["code"])
        answer.error = record.get("error")
        answer.chunks.append(record_error_body(answer.code, answer.error))
        answer.done = True
        return True
    answer.chunks.append(data)
    answer.done = last
    return last


def run(coro: Any) -> Any:
    """``asyncio.run`` for tests."""
    return asyncio.run(coro)
