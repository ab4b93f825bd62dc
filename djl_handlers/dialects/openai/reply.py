"""A chat reply read by the model's parsers (response side): reasoning, content and tool calls.

``reply_of(out)`` reads a finished reply once per request (kept in its ``OpenAIState``): the
reasoning parser of ``ResponseOptions.reasoning_parser`` splits it, then the tool-call parser of
``ToolPlan.parser`` reads the answer, for requests whose reply may be a call. ``message_fields``
adds the reasoning to a message under both names clients read: ``reasoning_content`` (LMI, the
DeepSeek API, LangChain) and ``reasoning`` (vLLM since 0.11). ``reasoning_tokens`` counts the tokens
before the answer, reported as ``usage.completion_tokens_details.reasoning_tokens`` as vLLM does.
"""

from __future__ import annotations

from typing import Any, Optional

from djl_handlers.dialects.openai.state import state_of
from djl_handlers.parsers.reasoning.base import ReasoningParser
from djl_handlers.parsers.registry import reasoning_parser, tool_parser
from djl_handlers.parsers.stream import Reply, ReplyStream, read_reply
from djl_handlers.parsers.tools.base import ToolParser
from djl_handlers.request.records import RequestOutput

__all__ = ["message_fields", "reasoning_tokens", "reads_reply", "reply_of", "reply_stream"]

REASONING_FIELDS = ("reasoning_content", "reasoning")


def _parsers(out: RequestOutput) -> tuple[Optional[ReasoningParser], Optional[ToolParser]]:
    name = out.request.response_options.reasoning_parser
    plan = out.request.tools
    reads_calls = plan is not None and plan.may_call and plan.mode != "named"
    return (reasoning_parser(name) if name else None,
            tool_parser(plan.parser) if reads_calls and plan is not None else None)


def reads_reply(out: RequestOutput) -> bool:
    """True when a parser reads this request's reply (reasoning, or calls in the model's format)."""
    return any(p is not None for p in _parsers(out))


def reply_of(out: RequestOutput) -> Reply:
    """The finished reply ``out`` (the request or one of its samples) as its parsers read it."""
    state = state_of(out)
    cached = state.replies.get(id(out))
    if cached is None:
        reasoning, tools = _parsers(out)
        plan_tools = out.request.tools.tools if out.request.tools is not None else []
        cached = state.replies[id(out)] = read_reply(out.generated_text, reasoning, tools, plan_tools)
    return cached


def reply_stream(out: RequestOutput) -> ReplyStream:
    """The request's ``ReplyStream``, made on first use."""
    state = state_of(out)
    if state.reply_stream is None:
        reasoning, tools = _parsers(out)
        plan_tools = out.request.tools.tools if out.request.tools is not None else []
        state.reply_stream = ReplyStream(reasoning, tools, plan_tools)
    return state.reply_stream


def message_fields(out: RequestOutput, reasoning: Optional[str]) -> dict[str, Any]:
    """The reasoning fields of a message or delta (none when the request does not send them)."""
    options = out.request.response_options
    if not options.reasoning_parser or not options.include_reasoning or reasoning is None:
        return {}
    return dict.fromkeys(REASONING_FIELDS, reasoning)


def reasoning_tokens(out: RequestOutput) -> Optional[int]:
    """The generated tokens before the answer (None: the request's reply is not split)."""
    if not out.request.response_options.reasoning_parser:
        return None
    total = 0
    for seq in out.sequences or [out]:
        if not seq.finished:
            continue
        start, offset = reply_of(seq).content_start, 0
        for token in seq.tokens:
            if offset >= start:
                break
            total += 1
            offset += len(token.text)
    return total
