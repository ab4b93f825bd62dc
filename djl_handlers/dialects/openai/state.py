"""The per-request state the OpenAI formatters keep between their calls, on ``Request.formatter_state``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from djl_handlers.request.records import FormatterState, RequestOutput

__all__ = ["OpenAIState", "state_of"]


@dataclass
class OpenAIState(FormatterState):
    """What every chunk of one response repeats, fixed on first use, and the tool-call reading.

    ``response_id`` and ``created``: made on the first call (None until then) so that all chunks
    agree; ``tool_calls``: the finished reply read back as calls (None: not read yet, ``[]``: not a
    call); ``tool_stream_started``: the first chunk of a streamed named call was sent; ``replies``,
    ``reply_stream`` and ``call_ids``: the reply as the model's parsers read it, whole or streamed.
    """

    response_id: Optional[str] = None
    created: Optional[int] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_stream_started: bool = False
    replies: dict[int, Any] = field(default_factory=dict)  # finished replies read (dialects.openai.reply)
    reply_stream: Optional[Any] = None  # the parsers' stream of a streamed reply
    call_ids: list[str] = field(default_factory=list)  # ids of the calls streamed so far


def state_of(out: RequestOutput) -> OpenAIState:
    """The request's ``OpenAIState``, created on first use."""
    state = out.request.formatter_state
    if not isinstance(state, OpenAIState):
        state = out.request.formatter_state = OpenAIState()
    return state
