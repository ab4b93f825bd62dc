"""How a chat request's reply will be read (request side): which reasoning parser splits it, which
tool-call parser reads ``tool_choice: auto`` replies, and whether the markers must stay in the text.

``reply_reading`` applies the model's ``option.reasoning_parser`` / ``option.tool_call_parser``
(``ParserSettings``) to one request:

- reasoning is read unless the request turns thinking off (``chat_template_kwargs``
  ``enable_thinking`` or ``thinking`` false: the template then closes the reasoning in the prompt)
  or constrains the reply to JSON from its first token (``guided_json``, ``response_format``, a
  forced tool call: the reply then has no reasoning to read; a regex, choice or grammar may spell
  the reasoning out, so those replies are read); ``include_reasoning: false`` reads it but does
  not send it;
- ``auto`` replies are read by the configured tool-call parser; ``required`` and named calls are
  constrained JSON, read by the built-in reading;
- a parser whose markers are special tokens (``<|python_tag|>``, ``[TOOL_CALLS]``, harmony's
  channels) needs them in the text: ``skip_special_tokens`` becomes false unless the request set it,
  as vLLM's parsers ask of it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from djl_handlers.errors import InvalidParameter
from djl_handlers.parsers.registry import BUILTIN_TOOL_PARSER, reasoning_parser, tool_parser
from djl_handlers.request.records import ResponseOptions, ToolPlan

__all__ = ["reply_reading"]

_THINKING_SWITCHES = ("enable_thinking", "thinking")


def reply_reading(body: dict[str, Any], reasoning: Optional[str], tools: str, plan: ToolPlan,
                  params: dict[str, Any], options: ResponseOptions) -> ResponseOptions:
    """``options`` with the request's reasoning reading; sets ``plan.parser`` and, where a parser
    needs its special tokens, ``params["skip_special_tokens"]``."""
    include = body.get("include_reasoning")
    if include is not None and not isinstance(include, bool):
        raise InvalidParameter("include_reasoning must be true or false", field="include_reasoning")
    plan.parser = tools if plan.mode == "auto" else BUILTIN_TOOL_PARSER
    name = reasoning if reasoning and _thinking(body) and not _constrained(params) else ""
    special = plan.may_call and tool_parser(plan.parser).special_tokens
    special = special or bool(name and getattr(reasoning_parser(name), "special_tokens", False))
    if special and body.get("skip_special_tokens") is None:
        params["skip_special_tokens"] = False
    return replace(options, reasoning_parser=name, include_reasoning=include is not False)


def _thinking(body: dict[str, Any]) -> bool:
    kwargs = body.get("chat_template_kwargs")
    return not (isinstance(kwargs, dict) and any(kwargs.get(k) is False for k in _THINKING_SWITCHES))


def _constrained(params: dict[str, Any]) -> bool:
    return "guided_json" in params or "guided_json_object" in params
