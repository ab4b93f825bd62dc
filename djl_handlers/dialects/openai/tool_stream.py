"""``chat_tools_sse``: the chat stream of a request whose reply the model's parsers read (it may
be a tool call, or it carries reasoning).

With a named function the reply *is* the arguments, so it streams as OpenAI does: a first delta with
``tool_calls[0]`` (``index``, ``id``, ``type``, ``function.name``, empty ``arguments``), then one
``function.arguments`` fragment per step, then ``finish_reason`` ``tool_calls`` (``length`` when the
budget cut it).

Otherwise each step feeds the text so far to the request's ``ReplyStream`` (:mod:`.reply`) and
sends what it found new, as vLLM streams it: a first chunk with the role, then reasoning deltas
(``reasoning_content`` and ``reasoning``), content deltas, and per call a first delta with
``index``, ``id``, ``type`` and ``function.name`` (``arguments`` empty) followed by deltas that
carry only ``index`` and an ``arguments`` fragment — the shape the ``openai`` client's stream
helpers and LangChain's chunk merging expect. Text that may still become a marker waits for the
next step; the built-in JSON reading (no ``option.tool_call_parser``) knows a reply is a call only
once it is complete, so it sends everything at the end. The last chunk's ``finish_reason`` is
``tool_calls`` when a call was sent (``length`` when the budget cut the reply); with
``parallel_tool_calls`` false only the first call is sent. One choice only (``n`` > 1 is refused
for this stream).
"""

from __future__ import annotations

from typing import Any, Optional

from djl_handlers.dialects.openai.reply import message_fields, reply_stream
from djl_handlers.dialects.openai.response import (
    OpenAIStreamFormatter,
    include_usage,
    openai_error,
    openai_finish_reason,
    usage,
)
from djl_handlers.dialects.openai.state import state_of
from djl_handlers.dialects.openai.tool_calls import call_id, parse_json
from djl_handlers.formatting.base import SAMPLES_NONE
from djl_handlers.parsers.stream import ReplyDelta
from djl_handlers.request.records import RequestOutput

__all__ = ["ToolStreamFormatter"]


class ToolStreamFormatter(OpenAIStreamFormatter):
    """Chat SSE read by the model's parsers (see module docstring)."""

    samples = SAMPLES_NONE

    def __init__(self, name: str = "chat_tools_sse") -> None:
        super().__init__(name, "chat")

    def _chunker(self, out: RequestOutput) -> Any:
        head = {**self._envelope(out)}
        extra_usage = {"usage": None} if include_usage(out) else {}

        def chunk(delta: dict[str, Any], finish: Optional[str] = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**head, "choices": [choice], **extra_usage}

        return chunk

    def __call__(self, out: RequestOutput) -> str:
        plan = out.request.tools
        if out.error is not None:
            return self._frame([openai_error(out)], done=True) if out.finished else ""
        chunk = self._chunker(out)
        state = state_of(out)
        events: list[dict[str, Any]] = []
        if plan is not None and plan.mode == "named":
            events = self._named(out, str(plan.function), chunk)
            finish = "tool_calls" if isinstance(parse_json(out.generated_text.strip()), dict) else None
        else:
            if not state.tool_stream_started:
                state.tool_stream_started = True
                events.append(chunk({"role": "assistant", "content": ""}))
            stream = reply_stream(out)
            if out.finished:  # the whole text once, as the scheduler left it
                delta = stream.feed(out.generated_text, True)
            else:
                delta = stream.extend("".join(t.text for t in out.new_tokens), False)
            events.extend(self._deltas(out, delta, chunk))
            finish = "tool_calls" if stream.called and out.finish_reason != "length" else None
        if out.finished:
            events.append(chunk({}, finish or openai_finish_reason(out)))
            if include_usage(out):
                events.append({**self._envelope(out), "choices": [], "usage": usage(out)})
        return self._frame(events, done=out.finished)

    @staticmethod
    def _deltas(out: RequestOutput, delta: ReplyDelta, chunk: Any) -> list[dict[str, Any]]:
        events = []
        shown = message_fields(out, delta.reasoning or None)
        if shown:
            events.append(chunk(shown))
        if delta.content:
            events.append(chunk({"content": delta.content}))
        plan = out.request.tools
        for call in delta.calls:
            if plan is not None and not plan.parallel and call.index > 0:
                break  # parallel_tool_calls false: the first call only
            if call.name is not None:
                first = {"index": call.index, "id": call_id(), "type": "function",
                         "function": {"name": call.name, "arguments": ""}}
                events.append(chunk({"tool_calls": [first]}))
            if call.arguments:
                events.append(chunk({"tool_calls": [{"index": call.index, "function": {"arguments": call.arguments}}]}))
        return events

    @staticmethod
    def _named(out: RequestOutput, name: str, chunk: Any) -> list[dict[str, Any]]:
        """The arguments of a forced named call, streamed as they are generated."""
        events: list[dict[str, Any]] = []
        state = state_of(out)
        if not state.tool_stream_started:
            state.tool_stream_started = True
            first = {"index": 0, "id": call_id(), "type": "function", "function": {"name": name, "arguments": ""}}
            events.append(chunk({"role": "assistant", "content": None, "tool_calls": [first]}))
        text = "".join(t.text for t in out.new_tokens)
        if text:
            events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": text}}]}))
        return events
