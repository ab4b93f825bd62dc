"""The reply parsers on the vLLM entry point: the configured names must be in vLLM's own registries.

``check_vllm_parsers(config)`` runs when the vLLM engine is built: ``option.reasoning_parser``
must name a parser of vLLM's ``ReasoningParserManager`` and, with
``option.enable_auto_tool_choice``, ``option.tool_call_parser`` one of its ``ToolParserManager``
(vLLM's own lists, so a name this vLLM lacks fails at load, listing vLLM's names). The replies
are then read by :mod:`djl_handlers.parsers` as on every engine (held to vLLM's parsers by the
parser corpus). vLLM's structured output is not told about the reasoning parser: a constraint
applies from the first token, as on the HF engine.
"""

from __future__ import annotations

from typing import Any

from djl_handlers.errors import ConfigError

__all__ = ["check_vllm_parsers"]


def check_vllm_parsers(config: Any) -> None:
    """``ConfigError`` naming the key when vLLM's registries do not know a configured parser."""
    chat = getattr(config, "chat", None)
    if chat is None:
        return
    if chat.reasoning_parser:
        from vllm.reasoning import ReasoningParserManager

        _check("option.reasoning_parser", chat.reasoning_parser, ReasoningParserManager)
    if chat.enable_auto_tool_choice:
        from vllm.tool_parsers import ToolParserManager

        _check("option.tool_call_parser", chat.tool_call_parser, ToolParserManager)


def _check(key: str, name: str, manager: Any) -> None:
    known = sorted({name for attr in ("lazy_parsers", "reasoning_parsers", "tool_parsers")
                    for name in getattr(manager, attr, {})})
    if known and name not in known:
        raise ConfigError(f"{key}={name!r} is not in this vLLM's registry; vLLM knows: {', '.join(known)}", field=key)
