"""The chat requests the parser tests send over HTTP (HF and vLLM entry points): a chat template
written for these tests (ChatML that lists ``tools``), the tool, the reply a literal regex forces,
and the model directory's ``serving.properties`` lines that turn the parsers on."""

from __future__ import annotations

# ChatML that shows the tools in a system turn, as Hermes/Qwen templates do (written for these tests)
TEMPLATE = """{%- if tools %}<|im_start|>system
You may call these tools:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{% endif -%}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content or '' }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
REPLY = "The user asks about Paris.</think>Let me check." + CALL
MESSAGES = [{"role": "user", "content": "Weather in Paris for two days?"}]


def literal(text: str) -> str:
    """A regular expression that matches exactly ``text``."""
    return "".join("\\n" if c == "\n" else ("\\" + c if c in r"\.^$*+?{}[]|()" else c) for c in text)


PARSER_OPTIONS = ["option.reasoning_parser=deepseek_r1", "option.enable_auto_tool_choice=true",
                  "option.tool_call_parser=hermes", "option.chat_template=tools_chat_template.jinja"]
