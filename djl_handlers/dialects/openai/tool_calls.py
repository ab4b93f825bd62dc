"""OpenAI tool calls on the response side: the generated text read back as ``tool_calls``.

``tool_calls(out)`` reads the request's ``ToolPlan`` (``Request.tools``, set by
:mod:`djl_handlers.dialects.openai.tools`): ``named`` → the text is the function's arguments;
``required`` → a list of ``{"name", "arguments"}`` (one object when ``parallel_tool_calls`` is
false); ``auto`` → the same shapes, or ``<tool_call>{...}</tool_call>`` blocks, when the whole
reply is one; anything else is an ordinary text reply. Each call gets an id ``call_<hex>`` and
``function.arguments`` as a JSON string, as OpenAI sends them; ``finish_reason`` is
``tool_calls``. The streamed form is :mod:`djl_handlers.dialects.openai.tool_stream`.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Optional

from djl_handlers.dialects.openai.state import state_of
from djl_handlers.request.records import RequestOutput, ToolPlan

__all__ = ["new_call", "parse_json", "tool_calls", "tool_message"]

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def tool_calls(out: RequestOutput) -> Optional[list[dict[str, Any]]]:
    """The reply as OpenAI ``tool_calls`` (None when it is not a call); computed once per request."""
    plan = out.request.tools
    if plan is None or not plan.may_call or out.error is not None:
        return None
    state = state_of(out)
    if state.tool_calls is not None:
        return state.tool_calls or None
    calls = _parse(out.generated_text.strip(), plan)
    state.tool_calls = calls or []
    return calls


def _parse(text: str, plan: ToolPlan) -> Optional[list[dict[str, Any]]]:
    names = set(plan.names)
    if plan.mode == "named":
        args = parse_json(text)
        return [new_call(str(plan.function), args)] if isinstance(args, dict) else None
    value = parse_json(text)
    if value is None and plan.mode == "auto":
        blocks = [parse_json(b) for b in _BLOCK.findall(text)]
        value = blocks if blocks and _BLOCK.sub("", text).strip() == "" else None
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            args = parse_json(args)
        if not isinstance(args, dict):
            return None
        calls.append(new_call(item["name"], args))
    return calls or None


def parse_json(text: str) -> Any:
    """``text`` as JSON, None when it is not."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def new_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI tool call with a fresh id; ``function.arguments`` as a JSON string."""
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }


def tool_message(out: RequestOutput) -> Optional[tuple[dict[str, Any], str]]:
    """``(message, finish_reason)`` for a finished reply that is a tool call, else None."""
    calls = tool_calls(out)
    if calls is None:
        return None
    return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"
