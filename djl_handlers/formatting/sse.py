"""``sse``: the LMI jsonlines records as Server-Sent Events (``data: {...}\\n\\n``).

Byte-compatible with DJL's ``sse`` formatter (v0.27.0-dlc / v0.29+): each jsonlines line is
prefixed with ``data: `` and followed by a blank line. A failed request ends with the same
closing record as ``jsonlines`` (``error``, ``code``, ``details.finish_reason == "error"``).
"""

from __future__ import annotations

from djl_handlers.formatting.lmi import Formatter, dumps, jsonlines_record, step_events
from djl_handlers.request.records import RequestOutput


def sse_event(payload: str) -> str:
    """One SSE event with a single ``data:`` field (the payload must hold no newline)."""
    return f"data: {payload}\n\n"


class SseFormatter(Formatter):
    """``sse``: one event per new token; the last event carries the closing fields."""

    name = "sse"
    content_type = "text/event-stream"

    def error_chunk(self, out: RequestOutput) -> str:
        return self(out)  # an SSE event, never a bare JSON line

    def __call__(self, out: RequestOutput) -> str:
        return "".join(
            sse_event(dumps(jsonlines_record(out, token, closing))) for _, token, closing in step_events(out)
        )
