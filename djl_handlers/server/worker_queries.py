"""The front end's questions to the worker outside inference (the front end has no tokenizer).

Each is a control call between batch steps, as adapter management makes them
(:meth:`~djl_handlers.server.runtime.ModelRuntime.control`): property ``handler`` =
``djl_handlers_query`` (``extensions.QUERY_HANDLER``), property ``op``, the client's body as content
``data``; the worker answers with the HTTP status and the body (:mod:`djl_handlers.queries`). The
model's facts (``op=model_info``) are asked once per worker process and kept.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from djl_handlers.extensions import QUERY_HANDLER
from djl_handlers.server.runtime import ModelRuntime
from djl_handlers.server.worker_process import WorkerDied

__all__ = ["QueryReply", "QueryUnavailable", "WorkerQueries"]


@dataclass(frozen=True)
class QueryReply:
    """The worker's answer: HTTP status and JSON body bytes."""

    code: int
    body: bytes


class QueryUnavailable(Exception):
    """No answer (worker down, died, timed out) or a handler without the query function."""

    def __init__(self, code: int, kind: str, message: str) -> None:
        """``kind``: DJL's exception name for the error body."""
        super().__init__(message)
        self.code, self.kind, self.message = code, kind, message


class WorkerQueries:
    """Asks the runtime's worker; keeps the model's facts per worker process."""

    def __init__(self, runtime: ModelRuntime) -> None:
        self.runtime = runtime
        self._facts: dict[str, Any] | None = None
        self._facts_of: tuple[int | None, int] | None = None

    async def ask(self, op: str, body: bytes = b"") -> QueryReply:
        """The worker's reply to ``op``; :class:`QueryUnavailable` when there is none."""
        if not self.runtime.alive():
            raise QueryUnavailable(503, "ServiceUnavailableException", "the worker is not running")
        content: list[tuple[str | None, bytes]] = [("data", body)] if body else []
        try:
            frame = await self.runtime.control({"handler": QUERY_HANDLER, "op": op}, content)
        except WorkerDied as exc:
            raise QueryUnavailable(503, "WlmException", str(exc)) from exc
        except asyncio.TimeoutError as exc:
            raise QueryUnavailable(503, "WlmException", f"the worker did not answer {op} in time") from exc
        data = b"".join(bytes(value) for _, value in frame.content or [])
        if _is_missing_function(frame.code, data):
            raise QueryUnavailable(501, "NotImplementedException",
                                   f"the model's handler does not answer {op} (it has no {QUERY_HANDLER} function; "
                                   "djl_handlers' entry points have it)")
        return QueryReply(frame.code, data)

    async def facts(self) -> dict[str, Any]:
        """The model's facts (``model_info``), asked once per worker process."""
        worker = self.runtime.worker
        key = (worker.pid, worker.restarts)
        if self._facts is None or self._facts_of != key:
            reply = await self.ask("model_info")
            if reply.code != 200:
                raise QueryUnavailable(reply.code, "WlmException", reply.body.decode("utf-8", "replace"))
            self._facts, self._facts_of = json.loads(reply.body), key
        return self._facts

    def known_facts(self) -> dict[str, Any] | None:
        """The facts asked before, when the worker is still the same process (no call)."""
        worker = self.runtime.worker
        return self._facts if self._facts_of == (worker.pid, worker.restarts) else None


def _is_missing_function(code: int, data: bytes) -> bool:
    """The worker's answer for a handler without the query function: DJL's 424 error body
    (the queries themselves never answer 424)."""
    if code != 424:
        return False
    try:
        body = json.loads(data)
    except ValueError:
        return True
    return isinstance(body, dict) and "has no function" in str(body.get("error", ""))
