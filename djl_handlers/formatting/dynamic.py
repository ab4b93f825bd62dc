"""Dynamic (static) batch bodies: ``[{"generated_text"}]`` lists and ``{"outputs": [...]}`` lines.

- ``dynamic_batch_body``: one request's response, a list with one ``{"generated_text"}`` per
  prompt (``inputs`` may be a string or a list). The ``Output`` layer serialises it like DJL's
  ``add_as_json`` (2-space indent, ``","``/``":"`` separators); ``dynamic_batch_json`` gives
  those exact bytes for callers that build the body themselves.
- ``dynamic_stream_line``: one line of a dynamic-batch stream (``option.enable_streaming``),
  ``{"outputs": [<new text per prompt>]}`` + newline, as DJL's default stream formatter, but
  with non-ASCII text written as is (DJL's default ``json.dumps`` escaped it as ``\\uXXXX``).
- ``dynamic_stream_error_line``: ``{"error_msg": ...}`` + newline, as DJL's default stream
  formatter writes an exception pushed into the stream.
"""

from __future__ import annotations

import json
from typing import Any

from djl_handlers.formatting.lmi import dumps


def dynamic_batch_body(texts: list[str]) -> list[dict[str, Any]]:
    """``[{"generated_text": t} for t in texts]``: one entry per prompt, in prompt order."""
    return [{"generated_text": text} for text in texts]


def dynamic_batch_json(texts: list[str]) -> str:
    """``dynamic_batch_body`` serialised as DJL's ``Output.add_as_json`` does."""
    return json.dumps(dynamic_batch_body(texts), ensure_ascii=False, allow_nan=False, indent=2, separators=(",", ":"))


def dynamic_stream_line(token_texts: list[str]) -> str:
    """One dynamic-batch stream line ``{"outputs": [...]}\\n`` (one text per prompt)."""
    return dumps({"outputs": list(token_texts)}) + "\n"


def dynamic_stream_error_line(message: str) -> str:
    """The stream line for a failure: ``{"error_msg": ...}\\n`` (never an empty message)."""
    return dumps({"error_msg": message.strip() or "generation failed"}) + "\n"
