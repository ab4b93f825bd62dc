"""OpenAI tool calls on the response side: the generated text read back as ``tool_calls``.

``tool_calls(out)`` reads ``out.request.extra["tools"]`` (set by
:mod:`djl_handlers.request.tools`): ``named`` → the text is the function's arguments;
``required`` → a list of ``{"name", "arguments"}`` (one object when ``parallel_tool_calls`` is
false); ``auto`` → the same shapes, or ``<tool_call>{...}</tool_call>`` blocks, when the whole
reply is one; anything else is an ordinary text reply. Each call gets an id ``call_<hex>`` and
``function.arguments`` as a JSON string, as OpenAI sends them; ``finish_reason`` is
``tool_calls``.

``ToolStreamFormatter`` (``chat_tools_sse``): with a named function the reply *is* the arguments,
so it streams as OpenAI does: a first delta with ``tool_calls[0]`` (``index``, ``id``, ``type``,
``function.name``, empty ``arguments``), then one ``function.arguments`` fragment per step, then
``finish_reason`` ``tool_calls`` (``length`` when the budget cut it). Otherwise a reply may turn out
to be a call only once it is complete, so the text is held back until the request finishes; then
the stream sends the role chunk, one ``tool_calls`` delta per call (with the whole
``function.arguments``; clients concatenate fragments, one fragment is valid), a final chunk with
``finish_reason`` ``tool_calls`` and ``[DONE]``. A reply that is not a call is sent as one content
delta instead.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Optional

from djl_handlers.formatting.openai import (
    OpenAIStreamFormatter,
    include_usage,
    openai_error,
    openai_finish_reason,
    usage,
)
from djl_handlers.request.records import RequestOutput

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def tool_calls(out: RequestOutput) -> Optional[list[dict[str, Any]]]:
    """The reply as OpenAI ``tool_calls`` (None when it is not a call); computed once per request."""
    spec = out.request.extra.get("tools")
    if not spec or out.error is not None:
        return None
    cached = out.request.extra.get("_tool_calls")
    if cached is not None:
        return cached or None
    calls = _parse(out.generated_text.strip(), spec)
    out.request.extra["_tool_calls"] = calls or []
    return calls


def _parse(text: str, spec: dict[str, Any]) -> Optional[list[dict[str, Any]]]:
    names = set(spec.get("names") or ())
    if spec.get("mode") == "named":
        args = _json(text)
        return [_call(spec["function"], args)] if isinstance(args, dict) else None
    value = _json(text)
    if value is None and spec.get("mode") == "auto":
        blocks = [_json(b) for b in _BLOCK.findall(text)]
        value = blocks if blocks and _BLOCK.sub("", text).strip() == "" else None
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            args = _json(args)
        if not isinstance(args, dict):
            return None
        calls.append(_call(item["name"], args))
    return calls or None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
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


class ToolStreamFormatter(OpenAIStreamFormatter):
    """Chat SSE for requests that may call tools (see module docstring)."""

    def __init__(self, name: str = "chat_tools_sse") -> None:
        super().__init__(name, "chat")

    def __call__(self, out: RequestOutput) -> str:
        spec = out.request.extra.get("tools") or {}
        if spec.get("mode") == "named" and out.error is None:
            return self._named(out, spec["function"])
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
        extra = out.request.extra
        if not extra.get("_tool_stream_started"):
            extra["_tool_stream_started"] = True
            call = _call(name, {})
            call["function"]["arguments"] = ""
            extra["_tool_stream_id"] = call["id"]
            events.append(chunk({"role": "assistant", "content": None, "tool_calls": [{"index": 0, **call}]}))
        text = "".join(t.text for t in out.new_tokens)
        if text:
            events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": text}}]}))
        if out.finished:
            complete = isinstance(_json(out.generated_text.strip()), dict)
            events.append(chunk({}, "tool_calls" if complete else openai_finish_reason(out)))
            if include_usage(out):
                events.append({**head, "choices": [], "usage": usage(out)})
        return self._frame(events, done=out.finished)
