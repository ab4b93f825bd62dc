"""Async mode's dynamic batching for the pooling kinds: requests that arrive while a forward runs wait
and then run together, so concurrent requests share forward passes as they do in a dynamic batch.

DJL's async engine awaits ``handle`` once per request. :class:`Gatherer` queues each request; one drain
task (on the awaiting loop) hands everything queued, at most ``limit`` requests, to the blocking
``answer`` function in a worker thread, then the next lot. The first request of an idle service starts
at once: no delay is added, requests wait only for the forward in progress.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["Gatherer"]

Answer = Callable[[list[Any]], list[Any]]


class Gatherer:
    """Runs ``answer`` over the requests that queued up (see the module docstring)."""

    def __init__(self, answer: Answer, limit: int) -> None:
        self._answer = answer
        self._limit = max(1, limit)
        self._pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self._draining = False

    async def submit(self, item: Any) -> Any:
        """``answer``'s result for ``item``, computed together with the requests queued beside it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((item, future))
        if not self._draining:
            self._draining = True
            loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                lot, self._pending = self._pending[:self._limit], self._pending[self._limit:]
                try:
                    results = await loop.run_in_executor(None, self._answer, [item for item, _ in lot])
                except Exception as exc:  # noqa: BLE001 - every request of the lot gets the failure
                    for _, future in lot:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(lot, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._draining = False
