"""The parsers by vLLM's names: ``option.reasoning_parser`` and ``option.tool_call_parser``.

An unknown name is a ``ConfigError`` naming the key and listing the known names, raised when the
model loads. ``json`` (no option set) is the built-in whole-reply reading of tool calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from djl_handlers.errors import ConfigError
from djl_handlers.parsers.reasoning.base import ReasoningParser
from djl_handlers.parsers.reasoning.granite import GraniteParser
from djl_handlers.parsers.reasoning.harmony import HarmonyParser
from djl_handlers.parsers.reasoning.think import ThinkParser
from djl_handlers.parsers.tools.base import ToolParser
from djl_handlers.parsers.tools.hermes import HermesParser
from djl_handlers.parsers.tools.llama import Llama3JsonParser
from djl_handlers.parsers.tools.mistral import MistralParser
from djl_handlers.parsers.tools.plain_json import PlainJsonParser
from djl_handlers.parsers.tools.pythonic import PythonicParser
from djl_handlers.parsers.tools.qwen3_xml import Qwen3XmlParser

__all__ = ["BUILTIN_TOOL_PARSER", "REASONING_PARSERS", "TOOL_PARSERS", "reasoning_parser", "tool_parser"]

REASONING_PARSERS: Mapping[str, Callable[[], ReasoningParser]] = {
    "deepseek_r1": lambda: ThinkParser("deepseek_r1", implicit_start=True),
    "qwen3": lambda: ThinkParser("qwen3", empty_is_none=True),
    "granite": GraniteParser,
    "openai_gptoss": HarmonyParser,
}
TOOL_PARSERS: Mapping[str, Callable[[], ToolParser]] = {
    "hermes": HermesParser,
    "qwen3_json": lambda: HermesParser("qwen3_json"),
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
    "qwen3_xml": Qwen3XmlParser,
    "qwen3_coder": lambda: Qwen3XmlParser("qwen3_coder"),
}
BUILTIN_TOOL_PARSER = "json"


def reasoning_parser(name: str) -> ReasoningParser:
    """The reasoning parser registered as ``name``; ``ConfigError`` naming the known ones."""
    factory = REASONING_PARSERS.get(name)
    if factory is None:
        raise ConfigError(f"option.reasoning_parser={name!r} is not known; known parsers: "
                          f"{', '.join(sorted(REASONING_PARSERS))}", field="option.reasoning_parser")
    return factory()


def tool_parser(name: str) -> ToolParser:
    """The tool-call parser registered as ``name`` (``json``: the built-in one); ``ConfigError``
    naming the known ones."""
    if name == BUILTIN_TOOL_PARSER:
        return PlainJsonParser()
    factory = TOOL_PARSERS.get(name)
    if factory is None:
        raise ConfigError(f"option.tool_call_parser={name!r} is not known; known parsers: "
                          f"{', '.join(sorted(TOOL_PARSERS))}", field="option.tool_call_parser")
    return factory()
