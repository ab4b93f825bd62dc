"""``chat_tools_sse``: the chat stream of a request whose reply may be a tool call.

With a named function the reply *is* the arguments, so it streams as OpenAI does: a first delta with
``tool_calls[0]`` (``index``, ``id``, ``type``, ``function.name``, empty ``arguments``), then one
``function.arguments`` fragment per step, then ``finish_reason`` ``tool_calls`` (``length`` when the
budget cut it). Otherwise a reply may turn out to be a call only once it is complete, so the text is
held back until the request finishes; then the stream sends the role chunk, one ``tool_calls`` delta
per call (with the whole ``function.arguments``; clients concatenate fragments, one fragment is
valid), a final chunk with ``finish_reason`` ``tool_calls`` and ``[DONE]``. A reply that is not a call
is sent as one content delta instead.
"""

from __future__ import annotations

from typing import Any, Optional

from djl_handlers.dialects.openai.response import (
    OpenAIStreamFormatter,
    include_usage,
    openai_error,
    openai_finish_reason,
    usage,
)
from djl_handlers.dialects.openai.state import state_of
from djl_handlers.dialects.openai.tool_calls import new_call, parse_json, tool_calls
from djl_handlers.formatting.base import SAMPLES_NONE
from djl_handlers.request.records import RequestOutput

__all__ = ["ToolStreamFormatter"]


class ToolStreamFormatter(OpenAIStreamFormatter):
    """Chat SSE for requests that may call tools (see module docstring); one choice only (``n`` > 1
    with tools is answered without streaming)."""

    samples = SAMPLES_NONE

    def __init__(self, name: str = "chat_tools_sse") -> None:
        super().__init__(name, "chat")

    def __call__(self, out: RequestOutput) -> str:
        plan = out.request.tools
        if plan is not None and plan.mode == "named" and out.error is None:
            return self._named(out, str(plan.function))
        if not out.finished:
            return ""
        if out.error is not None:
            return self._frame([openai_error(out)], done=True)
        head = {**self._envelope(out)}
        extra_usage = {"usage": None} if include_usage(out) else {}
        events: list[dict[str, Any]] = []
        calls = tool_calls(out)

        def chunk(delta: dict[str, Any], finish: Optional[str] = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**head, "choices": [choice], **extra_usage}

        if calls is None:
            events.append(chunk({"role": "assistant", "content": out.generated_text}))
            events.append(chunk({}, openai_finish_reason(out)))
        else:
            events.append(chunk({"role": "assistant", "content": None}))
            for index, call in enumerate(calls):
                events.append(chunk({"tool_calls": [{"index": index, **call}]}))
            events.append(chunk({}, "tool_calls"))
        if include_usage(out):
            events.append({**head, "choices": [], "usage": usage(out)})
        return self._frame(events, done=True)

    def _named(self, out: RequestOutput, name: str) -> str:
        """The arguments of a forced named call, streamed as they are generated."""
        head = {**self._envelope(out)}
        extra_usage = {"usage": None} if include_usage(out) else {}

        def chunk(delta: dict[str, Any], finish: Optional[str] = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**head, "choices": [choice], **extra_usage}

        events: list[dict[str, Any]] = []
        state = state_of(out)
        if not state.tool_stream_started:
            state.tool_stream_started = True
            call = new_call(name, {})
            call["function"]["arguments"] = ""
            events.append(chunk({"role": "assistant", "content": None, "tool_calls": [{"index": 0, **call}]}))
        text = "".join(t.text for t in out.new_tokens)
        if text:
            events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": text}}]}))
        if out.finished:
            complete = isinstance(parse_json(out.generated_text.strip()), dict)
            events.append(chunk({}, "tool_calls" if complete else openai_finish_reason(out)))
            if include_usage(out):
                events.append({**head, "choices": [], "usage": usage(out)})
        return self._frame(events, done=out.finished)
