"""OpenAI tool calling on the request side: ``tools``, ``tool_choice``, ``parallel_tool_calls``
and the tool turns of a conversation.

``parse_tools`` validates the fields and returns a ``ToolPlan`` (``request.records``): which tools
the prompt shows, the JSON Schema that forces the reply (``required`` / a named function) and what
the formatter reads back (``Request.tools``). Forced calls are constrained with ``guided_json``, so
their arguments always parse:

- ``{"type": "function", "function": {"name": F}}``: the reply is F's arguments object;
- ``required``: the reply is ``[{"name": ..., "arguments": {...}}, ...]`` (one call up to as many
  calls as there are tools; exactly one object, not a list, when ``parallel_tool_calls`` is false);
- ``auto``: no constraint; the reply is read as a call when it is such JSON (or ``<tool_call>``
  blocks), otherwise it is text;
- ``none``: the tools are not shown and the reply is text.

``render_messages`` turns the OpenAI messages (assistant ``tool_calls``, ``tool`` results) into
what the chat template gets: with a template that reads ``tools`` the messages pass through;
otherwise the tools and the calling convention are described in a system message and the tool
turns become plain text. Nothing here imports an ML library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Optional

from djl_handlers.dialects.openai.content import read_content
from djl_handlers.errors import InvalidParameter, InvalidRequest
from djl_handlers.media.records import ImageRef
from djl_handlers.request.records import ToolPlan

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def parse_tools(body: dict[str, Any]) -> ToolPlan:
    """Validate ``tools``/``tool_choice``/``parallel_tool_calls``; ``InvalidParameter`` naming the field."""
    raw = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise InvalidParameter("parallel_tool_calls must be true or false", field="parallel_tool_calls")
    if raw is None:
        if choice not in (None, "none"):
            raise InvalidParameter("tool_choice needs tools", field="tool_choice")
        return ToolPlan(parallel=parallel)
    if not isinstance(raw, list) or not raw:
        raise InvalidParameter("tools must be a non-empty list of function tools (omit it for none)", field="tools")
    tools = [_tool(t, i) for i, t in enumerate(raw)]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise InvalidParameter("tools: function names must be unique", field="tools")
    plan = ToolPlan(tools, parallel=parallel)
    if not tools:
        if choice not in (None, "none", "auto"):
            raise InvalidParameter("tool_choice needs at least one tool", field="tool_choice")
        return plan
    _apply_choice(plan, choice, names)
    return plan


def _apply_choice(plan: ToolPlan, choice: Any, names: list[str]) -> None:
    if choice is None or choice in ("auto", "none"):
        plan.mode = choice or "auto"
    elif choice == "required":
        plan.mode = "required"
        plan.schema = _required_schema(plan.tools, plan.parallel)
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise InvalidParameter(f"tool_choice names function {json.dumps(name)}, which is not in tools",
                                   field="tool_choice")
        plan.mode, plan.function = "named", name
        plan.schema = _parameters(plan.tools[names.index(name)])
    else:
        raise InvalidParameter(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            field="tool_choice",
        )


def _tool(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise InvalidParameter(f'{where} must be {{"type": "function", "function": {{...}}}}', field="tools")
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidParameter(f"{where}.function.name must be 1-64 letters, digits, '_', '-', '.' or ':'",
                               field="tools")
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidParameter(f"{where}.function.description must be a string", field="tools")
    params = fn.get("parameters")
    if params is not None:
        from djl_handlers.params.structured import check_schema

        if not isinstance(params, dict):
            raise InvalidParameter(f"{where}.function.parameters must be a JSON Schema object", field="tools")
        check_schema(params, f"{where}.function.parameters")
    out: dict[str, Any] = {"name": name}
    if description:
        out["description"] = description
    out["parameters"] = params if params is not None else dict(EMPTY_PARAMETERS)
    return {"type": "function", "function": out}


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    return dict(tool["function"]["parameters"])


def _required_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]}, "arguments": _parameters(t)},
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    one: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    # at most one call per tool: a small model otherwise repeats the same call until max_tokens
    return {"type": "array", "items": one, "minItems": 1, "maxItems": len(tools)} if parallel else one


# --------------------------------------------------------------------------- messages


def check_messages(messages: Any, text_check: Callable[[str, str], Any],
                   images: Optional[list[ImageRef]] = None) -> list[dict[str, Any]]:
    """Validate OpenAI chat messages (system/user/assistant/tool, assistant ``tool_calls``, content
    parts); returns them with content as a string (or None), or as a list of text and image items
    for a user message with images (:mod:`.content`; their references appended to ``images``; with
    ``images`` None an image part is refused)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list of {role, content} objects", field="messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise InvalidRequest(f"messages[{i}] must be an object with a string 'role'", field="messages")
        role = text_check(msg["role"], "messages")
        content = _message_content(msg.get("content"), i, role, images, text_check)
        calls = msg.get("tool_calls")
        if content is None and not (role == "assistant" and calls):
            raise InvalidRequest(f"messages[{i}].content must be a string", field="messages")
        if isinstance(content, str):
            text_check(content, "messages")
        item: dict[str, Any] = {"role": role, "content": content}
        if calls is not None:
            if role != "assistant":
                raise InvalidRequest(f"messages[{i}].tool_calls is only allowed on assistant messages",
                                     field="messages")
            item["tool_calls"] = _message_calls(calls, i)
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str):
                raise InvalidRequest(f"messages[{i}].tool_call_id must be a string (role tool)", field="messages")
            item["tool_call_id"] = call_id
        if isinstance(msg.get("name"), str):
            item["name"] = msg["name"]
        out.append(item)
    return out


def _message_content(content: Any, i: int, role: str, images: Optional[list[ImageRef]],
                     text_check: Callable[[str, str], Any]) -> Any:
    found: list[ImageRef] = []
    read = read_content(content, i, role, found, text_check)
    if found and images is None:
        raise InvalidRequest(f"{found[0].part}: image parts are taken in chat requests only", field=found[0].part)
    if images is not None:
        images.extend(found)
    return read


def _message_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise InvalidRequest(f"messages[{i}].tool_calls must be a list", field="messages")
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"messages[{i}].tool_calls entries need function.name", field="messages")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise InvalidRequest(f"messages[{i}].tool_calls: function.arguments is not JSON",
                                     field="messages") from None
        out.append({"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def render_messages(messages: list[dict[str, Any]], plan: ToolPlan, template_reads_tools: bool) -> tuple[
    list[dict[str, Any]], Optional[list[dict[str, Any]]]
]:
    """``(messages, tools)`` for the chat template (see module docstring)."""
    shown = plan.tools if plan.mode != "none" else []
    if template_reads_tools:
        return messages, (shown or None)
    plain = [_plain(m) for m in messages]
    if not shown:
        return plain, None
    system = _tool_system_prompt(plan, shown)
    if plain and plain[0]["role"] == "system":
        plain[0] = {"role": "system", "content": plain[0]["content"] + "\n\n" + system}
    else:
        plain.insert(0, {"role": "system", "content": system})
    return plain, None


def _plain(msg: dict[str, Any]) -> dict[str, Any]:
    """A tool turn as plain text for templates that know only role/content."""
    if msg.get("tool_calls"):
        calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in msg["tool_calls"]]
        text = json.dumps(calls if len(calls) > 1 else calls[0])
        return {"role": "assistant", "content": ((msg.get("content") or "") + "\n" + text).strip()}
    if msg["role"] == "tool":
        return {"role": "user", "content": f"Result of tool call {msg['tool_call_id']}: {msg['content']}"}
    return {"role": msg["role"], "content": msg["content"]}


def _tool_system_prompt(plan: ToolPlan, tools: list[dict[str, Any]]) -> str:
    listing = "\n".join(json.dumps(t["function"]) for t in tools)
    text = "You can call these functions:\n" + listing + "\n"
    if plan.mode == "named":
        return text + f"Call the function {plan.function}: reply with its arguments as a JSON object."
    return text + ('To call a function, reply with JSON {"name": <function name>, "arguments": <arguments object>} '
                   "and nothing else.")
