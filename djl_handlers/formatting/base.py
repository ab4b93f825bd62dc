"""The ``Formatter`` base class every output format implements, and the error accessors all
dialects share (the LMI formats are in ``lmi.py``, the others in their own modules)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from djl_handlers.errors import record_error_body
from djl_handlers.request.records import RequestOutput

# Error code used when a failed request carries none (DJL's rolling-batch failure code).
DEFAULT_ERROR_CODE = 424
# Formatter.samples: how a format answers a request with several samples (n/best_of > 1)
SAMPLES_NONE, SAMPLES_FINAL, SAMPLES_STREAMED = "none", "final", "streamed"


class Formatter(ABC):
    """A named, stateless step formatter: ``RequestOutput`` -> text chunk for the HTTP body.

    A formatter is also its API dialect's error renderer (the scheduler calls these, the server
    never renders a request's error): ``error_body`` for a request that failed before any byte
    was sent (the whole body; the status is the error's code) and ``error_chunk`` for one that
    failed mid-stream (the last chunk). Both default to DJL's own rendering of a failed record,
    compact ``{"error","code"}``, which the LMI ``json``/``jsonlines``/``sse`` bodies keep before
    the stream (DJL's front end writes exactly that); dialects with their own error object
    override them.
    """

    name: str = ""
    content_type: str = "application/json"
    #: What the format does with a request that decodes several samples (``n``/``best_of`` > 1;
    #: ``RequestOutput.sequences``): ``SAMPLES_NONE`` cannot show them (the request is refused),
    #: ``SAMPLES_FINAL`` writes every returned sample once all have finished, ``SAMPLES_STREAMED``
    #: streams each sample's tokens under its index (``best_of`` > ``n`` cannot be streamed: which
    #: samples are returned is known only at the end).
    samples: str = SAMPLES_NONE

    @abstractmethod
    def __call__(self, out: RequestOutput) -> str:
        """Text to append to the body for this step; ``""`` for nothing."""

    def error_body(self, out: RequestOutput) -> str:
        """The whole body for a request that failed before anything was sent."""
        return record_error_body(error_code(out), error_message(out))

    def error_chunk(self, out: RequestOutput) -> str:
        """The last chunk of a stream that failed after some data was sent."""
        return record_error_body(error_code(out), error_message(out))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.content_type})>"


def is_error(out: RequestOutput) -> bool:
    """True when the request ended in failure."""
    return out.error is not None or out.finish_reason == "error"


def error_message(out: RequestOutput) -> str:
    """A non-empty error message (v0.27 sometimes sent an empty one)."""
    text = (out.error or "").strip()
    return text if text else "generation failed"


def error_code(out: RequestOutput) -> int:
    """The request's error code, DJL's 424 when none was recorded."""
    return out.error_code if out.error_code is not None else DEFAULT_ERROR_CODE
