"""Requests whose images are being prepared off the step thread (sync rolling mode).

Loading a request's images (a remote fetch waits up to ``option.media_fetch_timeout``) and running
the model's processor take milliseconds to seconds. In sync rolling mode the step loop runs on the
thread that admits requests, so a request with images takes its place in the batch at once as a
``PreparingSlot`` (its records carry no data, as a queued request's do) while a pool thread
prepares its media; the batch admits it into the engine at the first step after it is ready. Its
neighbours keep decoding meanwhile. Async mode prepares images before admission
(:func:`djl_handlers.scheduling.media.preload_images`) and never parks a request here.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from djl_handlers.extensions import STEP_TOKENS_KEY
from djl_handlers.formatting.base import Formatter
from djl_handlers.request.records import Request
from djl_handlers.scheduling.slot import RequestSlot

__all__ = ["MediaPool", "PreparingSlot"]


class PreparingSlot(RequestSlot):
    """A request in the batch whose media a pool thread prepares (``future``); until then each step's
    record is empty and not last."""

    def __init__(self, request: Request, formatter: Formatter, request_id: int, future: Future[None]) -> None:
        super().__init__(request, formatter, request_id)
        self.future = future

    def record(self) -> dict[str, Any]:
        if self.output.finished or self.output.error is not None:
            return super().record()
        return {"data": "", "last": False, STEP_TOKENS_KEY: 0}


class MediaPool:
    """The threads that prepare requests' media (started at first use; two: load and process overlap)."""

    def __init__(self, workers: int = 2) -> None:
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, fn: Any, *args: Any) -> Future[None]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="media")
        return self._pool.submit(fn, *args)
