"""Chat options: reasoning and tool-call parsers and the chat template (LMI 0.36's keys).

``option.reasoning_parser`` (vLLM's names) turns on reading the reasoning out of replies;
``option.enable_reasoning`` may turn it off again (``false``), and ``true`` without a parser is an
error. ``option.enable_auto_tool_choice`` reads ``tool_choice: auto`` replies with
``option.tool_call_parser`` (vLLM's names; required with it); without it the built-in JSON reading
serves ``auto``. ``option.chat_template``: a file (absolute, or in the model directory) or the
Jinja text itself, used instead of the tokenizer's. An unknown parser name fails at load, naming
the key and the known names; a tool-call parser without ``enable_auto_tool_choice`` is logged as
unused (vLLM's rule: the two go together).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from djl_handlers.config.reader import Reader
from djl_handlers.errors import ConfigError
from djl_handlers.parsers.registry import BUILTIN_TOOL_PARSER, REASONING_PARSERS, TOOL_PARSERS

__all__ = ["ChatOptions", "read_chat_options"]

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChatOptions:
    """How chat replies are read: ``reasoning_parser`` (None: not read), ``tool_call_parser``
    (``json``: the built-in reading), and the ``chat_template`` text (None: the tokenizer's)."""

    reasoning_parser: str | None = None
    tool_call_parser: str = BUILTIN_TOOL_PARSER
    enable_auto_tool_choice: bool = False
    chat_template: str | None = None


def read_chat_options(r: Reader, model_dir: str | None) -> ChatOptions:
    """The chat options of the properties ``r`` reads."""
    reasoning = _name(r, "reasoning_parser", tuple(sorted(REASONING_PARSERS)))
    enabled = r.boolean("enable_reasoning", reasoning is not None)
    if enabled and reasoning is None:
        raise ConfigError("option.enable_reasoning=true needs option.reasoning_parser; known parsers: "
                          + ", ".join(sorted(REASONING_PARSERS)), field="option.reasoning_parser")
    auto = r.boolean("enable_auto_tool_choice", False)
    tools = _name(r, "tool_call_parser", tuple(sorted(TOOL_PARSERS)))
    if tools is not None and not auto:
        LOG.warning("option.tool_call_parser=%s is used only with option.enable_auto_tool_choice=true; "
                    "tool_choice auto replies are read by the built-in JSON reading", tools)
    if auto and tools is None:
        raise ConfigError("option.enable_auto_tool_choice=true needs option.tool_call_parser; known parsers: "
                          + ", ".join(sorted(TOOL_PARSERS)), field="option.tool_call_parser")
    return ChatOptions(
        reasoning_parser=reasoning if enabled else None,
        tool_call_parser=tools if (auto and tools) else BUILTIN_TOOL_PARSER,
        enable_auto_tool_choice=auto,
        chat_template=_template(r, model_dir),
    )


def _name(r: Reader, key: str, known: tuple[str, ...]) -> str | None:
    found = r.get(key)
    if found is None:
        return None
    if found[1].strip() not in known:
        raise ConfigError(f"{found[0]}={found[1]!r} is not a known parser; known parsers: {', '.join(known)}",
                          field=found[0])
    return found[1].strip()


def _template(r: Reader, model_dir: str | None) -> str | None:
    found = r.get("chat_template")
    if found is None:
        return None
    label, value = found
    if "{{" in value or "{%" in value:
        return value
    path = Path(value)
    if not path.is_absolute() and model_dir:
        path = Path(model_dir) / path
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{label}={value!r} is neither a readable file nor a Jinja template ({exc.strerror})",
                          field=label) from None
