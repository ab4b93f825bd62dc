"""Custom formatting for the compat tests (served by DJL's Python engine and by djl-handlers serve).

Input: ``{"prompt": "...", "n": 4, "seed": 0}`` (or a plain LMI body) → greedy generation of ``n``
tokens (``seed`` optional, passed on).
Output: one ``{"piece": ...}`` line per step that produced text, then
``{"answer": ..., "finish": ..., "n_tokens": ...}``; Content-Type ``application/x-compat-lines``.
"""

from __future__ import annotations

import json
from typing import Any

from djl_handlers.custom_hooks import input_formatter, output_formatter
from djl_handlers.request.parser import decode_body


@input_formatter
def prompt_and_count(item: Any, **kwargs: Any) -> Any:
    body = decode_body(item)
    if isinstance(body, dict) and "prompt" in body:
        params: dict[str, Any] = {"max_new_tokens": int(body.get("n", 4)), "do_sample": False}
        if "seed" in body:
            params["seed"] = body["seed"]
        return {"inputs": str(body["prompt"]), "parameters": params}
    return body


@output_formatter
def pieces_then_answer(out: Any) -> str:
    text = "".join(token.text for token in out.new_tokens)
    chunk = json.dumps({"piece": text}) + "\n" if text else ""
    if out.finished:
        final = {"answer": out.generated_text, "finish": out.finish_reason, "n_tokens": len(out.tokens)}
        chunk += json.dumps(final) + "\n"
    return chunk


pieces_then_answer.content_type = "application/x-compat-lines"  # type: ignore[attr-defined]
