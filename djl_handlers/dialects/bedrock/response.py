"""Bedrock-style third-party formatters ``3p`` (non-stream) and ``3p_stream`` (jsonlines).

Shapes as DJL v0.29+ ``djl_python/output_formatter.py`` writes them:

- ``3p``: ``{"body": {"generation", "prompt_token_count", "generation_token_count",
  "stop_reason"}, "metering": {"inputTokenCount", "outputTokenCount"},
  "content_type": "application/json"}``; ``generation`` is the full text (the parser turns
  ``return_full_text`` on for 3p requests, as DJL does).
- ``3p_stream``: one line per token ``{"body": {"generation": <token text>,
  "prompt_token_count": <on the first token, else null>, "generation_token_count": <running
  count>, "stop_reason": <on the last token, else null>}, "metering": {"outputTokenCount"[,
  "inputTokenCount" on the first token]}, "content_type": "application/jsonlines"}``.
- Failure: ``stop_reason`` ``error`` and ``"error": {"error_code", "error_msg"}``; non-stream
  also nulls ``generation`` and zeroes the counts as DJL does. (DJL nests the non-stream error
  one level deeper and always says 400; we use one flat shape and the request's real code.)
"""

from __future__ import annotations

from typing import Any

from djl_handlers.formatting.lmi import (
    Formatter,
    dumps,
    error_code,
    error_message,
    finish_reason,
    is_error,
    step_events,
)
from djl_handlers.request.records import RequestOutput, Token


def _error(out: RequestOutput) -> dict[str, Any]:
    return {"error_code": error_code(out), "error_msg": error_message(out)}


class ThreePFormatter(Formatter):
    """``3p``: nothing until finished, then one Bedrock-style object."""

    name = "3p"
    content_type = "application/json"

    def error_body(self, out: RequestOutput) -> str:
        return self(out)

    def __call__(self, out: RequestOutput) -> str:
        if not out.finished:
            return ""
        failed = is_error(out)
        prompt_count = 0 if failed else out.prompt_tokens
        output_count = 0 if failed else len(out.tokens)
        result: dict[str, Any] = {
            "body": {
                "generation": None if failed else out.full_text,
                "prompt_token_count": prompt_count,
                "generation_token_count": output_count,
                "stop_reason": finish_reason(out),
            },
            "metering": {"inputTokenCount": prompt_count, "outputTokenCount": output_count},
            "content_type": "application/json",
        }
        if failed:
            result["error"] = _error(out)
        return dumps(result)


class ThreePStreamFormatter(Formatter):
    """``3p_stream``: one Bedrock-style line per new token; the last line has ``stop_reason``."""

    name = "3p_stream"
    content_type = "application/jsonlines"

    def error_body(self, out: RequestOutput) -> str:
        return self(out)

    def error_chunk(self, out: RequestOutput) -> str:
        return self(out)

    def __call__(self, out: RequestOutput) -> str:
        return "".join(
            dumps(self._line(out, index, token, closing)) + "\n" for index, token, closing in step_events(out)
        )

    @staticmethod
    def _line(out: RequestOutput, index: int, token: Token, closing: bool) -> dict[str, Any]:
        first = index == 0
        count = min(index + 1, len(out.tokens))
        metering: dict[str, Any] = {"outputTokenCount": count}
        if first:
            metering["inputTokenCount"] = out.prompt_tokens
        line: dict[str, Any] = {
            "body": {
                "generation": token.text,
                "prompt_token_count": out.prompt_tokens if first else None,
                "generation_token_count": count,
                "stop_reason": finish_reason(out) if closing else None,
            },
            "metering": metering,
            "content_type": "application/jsonlines",
        }
        if closing and is_error(out):
            line["error"] = _error(out)
        return line
