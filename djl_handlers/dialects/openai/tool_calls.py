"""OpenAI tool calls on the response side: the generated text read back as ``tool_calls``.

``tool_calls(out)`` reads the request's ``ToolPlan`` (``Request.tools``, set by
:mod:`djl_handlers.dialects.openai.tools`): ``named`` → the text is the function's arguments;
otherwise the reply is read by the plan's tool-call parser (:mod:`djl_handlers.parsers`: the
model's own format under ``option.tool_call_parser`` for ``auto``, the built-in JSON reading for
``required`` and without the option), after the reasoning parser took the reasoning off
(:mod:`.reply`); with ``parallel_tool_calls`` false only the first call counts. Each call gets
an id ``call_<hex>`` and ``function.arguments`` as a JSON string, as OpenAI sends them;
``finish_reason`` is ``tool_calls``. The streamed form is
:mod:`djl_handlers.dialects.openai.tool_stream`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Optional

from djl_handlers.dialects.openai.reply import message_fields, reply_of
from djl_handlers.dialects.openai.state import state_of
from djl_handlers.request.records import RequestOutput

__all__ = ["call_id", "new_call", "parse_json", "tool_calls", "tool_message"]


def tool_calls(out: RequestOutput) -> Optional[list[dict[str, Any]]]:
    """The reply as OpenAI ``tool_calls`` (None when it is not a call); computed once per request."""
    plan = out.request.tools
    if plan is None or not plan.may_call or out.error is not None:
        return None
    state = state_of(out)
    if state.tool_calls is not None:
        return state.tool_calls or None
    if plan.mode == "named":
        args = parse_json(out.generated_text.strip())
        calls = [new_call(str(plan.function), args)] if isinstance(args, dict) else []
    else:
        calls = [_call(c.name, c.arguments) for c in reply_of(out).calls][: None if plan.parallel else 1]
    state.tool_calls = calls
    return calls or None


def parse_json(text: str) -> Any:
    """``text`` as JSON, None when it is not."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def call_id() -> str:
    """A fresh tool-call id, ``call_<hex>`` as OpenAI makes them."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def new_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI tool call with a fresh id; ``function.arguments`` as a JSON string."""
    return _call(name, json.dumps(args, ensure_ascii=False))


def tool_message(out: RequestOutput) -> Optional[tuple[dict[str, Any], str]]:
    """``(message, finish_reason)`` for a finished reply that is a tool call, else None. The
    content beside the calls is the text before them (None when there is none)."""
    calls = tool_calls(out)
    if calls is None:
        return None
    plan = out.request.tools
    reply = reply_of(out) if plan is not None and plan.mode != "named" else None
    message: dict[str, Any] = {"role": "assistant", "content": reply.content if reply else None}
    if reply is not None:
        message.update(message_fields(out, reply.reasoning))
    message["tool_calls"] = calls
    return message, "tool_calls"
