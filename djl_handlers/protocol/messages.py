"""The units DJL's front end and worker exchange: one request as DJL's ``Input``, one reply, the
``batch_NNN.`` key naming of batched frames, and the failure that breaks a whole batch.

Extension (ignored by DJL's own worker): a rolling-batch slot whose client went away carries property
``batch_NNN.djl_handlers_cancel=true`` on every later step until its record says ``last``
(:data:`djl_handlers.extensions.CANCEL_PROPERTY`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from djl_handlers.io import wire

if TYPE_CHECKING:
    from djl_handlers.protocol.rolling import FrontEndSlot

__all__ = [
    "BatchFailure",
    "Content",
    "Frame",
    "Reply",
    "WorkerRequest",
    "batch_prefix",
    "body_of",
    "reply_of",
    "split_properties",
]

_BATCH_PROP = re.compile(r"batch_(\d+)_(.+)", re.DOTALL)

Content = list[tuple[str | None, bytes]]
Frame = tuple[dict[str, str], Content]


@dataclass
class WorkerRequest:
    """One HTTP request as DJL's ``Input``: headers as properties, body as ``data``, query entries."""

    properties: dict[str, str]
    content: Content

    def data(self) -> bytes:
        """DJL's ``Input.getData()``: the ``data`` entry, else the first entry, else empty."""
        for key, value in self.content:
            if key == "data":
                return value
        return self.content[0][1] if self.content else b""


@dataclass
class Reply:
    """What one HTTP request gets back from a non-rolling call."""

    code: int
    message: str
    headers: dict[str, str]
    body: bytes = b""
    chunks: Iterator[tuple[bytes, bool]] | None = None


class BatchFailure(Exception):
    """A reply that breaks the protocol (wrong record count, unknown key...): fails the whole batch."""

    def __init__(self, code: int, message: str) -> None:
        """``code`` is the HTTP status every request of the batch gets."""
        super().__init__(message)
        self.code = code
        self.message = message
        self.slots: list[FrontEndSlot] = []  # the requests it fails, where the caller needs them


def batch_prefix(index: int) -> str:
    """``batch_007.``: DJL pads the index to three digits (Python reads characters 6-8)."""
    return f"batch_{index:03d}."


def body_of(content: Content) -> bytes:
    """The HTTP body DJL takes from reply content: entry ``data``, else the first, else empty."""
    for key, value in content:
        if key == "data":
            return value
    return content[0][1] if content else b""


def reply_of(frame: wire.OutputFrame) -> Reply:
    """A non-batch reply frame as one HTTP reply."""
    return Reply(frame.code, frame.message, dict(frame.properties), body_of(frame.content or []), frame.chunks)


def split_properties(properties: Mapping[str, str], size: int) -> tuple[dict[str, str], list[dict[str, str]]]:
    """Shared properties and per-request ones (``batch_{i}_<name>``, index < size)."""
    shared: dict[str, str] = {}
    per: list[dict[str, str]] = [{} for _ in range(size)]
    for key, value in properties.items():
        match = _BATCH_PROP.fullmatch(key)
        if match and int(match.group(1)) < size:
            per[int(match.group(1))][match.group(2)] = value
        else:
            shared[key] = value
    return shared, per
