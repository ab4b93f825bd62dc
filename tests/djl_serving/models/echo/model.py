"""Echo handler written against DJL's own ``djl_python`` Input/Output API.

Used by tests/integration/test_djl_server_smoke.py to observe what DJL's Java side sends to a
handler and what it does with the Output it gets back. It imports only ``djl_python`` (the copy
that DJL extracts from its jar) and the standard library.

Request body (JSON): anything; these keys change the behaviour:
  ``raise``  -> the handler raises ValueError (DJL turns it into an error Output);
  ``memory`` -> the handler raises MemoryError;
  ``code``   -> the handler returns ``Output().error(..., code=<code>)``;
  ``stream`` -> the answer is streamed with ``Output.add_stream_content`` (3 chunks).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from djl_python import Input, Output

_INIT: dict[str, str] = {}


def _content_keys(inp: Input) -> list[str]:
    content = inp.get_content()
    return [content.key_at(i) for i in range(content.size())]


def _describe(item: Input, batch: Input, index: int) -> dict[str, Any]:
    raw = item.get_as_bytes() if item.contains_key("data") else b""
    try:
        body: Any = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode("utf-8", "replace")
    return {
        "echo": body,
        "index": index,
        "batch_size": batch.get_batch_size() if batch.is_batch() else None,
        "properties": dict(item.get_properties()),
        "content_keys": _content_keys(item),
        "raw_property_keys": sorted(batch.get_properties().keys()),
        "raw_content_keys": _content_keys(batch),
        "init": dict(_INIT),
    }


def _chunks(words: list[str]) -> Iterator[str]:
    yield from words


def handle(inputs: Input) -> Output | None:
    """DJL entry point: the first (empty) call stores the init properties."""
    if not _INIT:
        _INIT.update(inputs.get_properties())
        _INIT["_init_was_empty"] = str(inputs.is_empty())
    if inputs.is_empty():
        return None
    items = inputs.get_batches()
    bodies = [_describe(item, inputs, i) for i, item in enumerate(items)]
    first = bodies[0]["echo"] if isinstance(bodies[0]["echo"], dict) else {}
    if first.get("raise"):
        raise ValueError("echo failure requested")
    if first.get("memory"):
        raise MemoryError("echo pretends to be out of memory")
    if first.get("code"):
        return Output().error("echo error requested", code=int(first["code"]))
    out = Output()
    out.add_property("Content-Type", "application/json")
    out.add_property("X-Echo-Items", str(len(items)))
    if first.get("stream"):
        out.add_property("Content-Type", "application/jsonlines")
        return out.add_stream_content(_chunks(["one\n", "two\n", "three\n"]), output_formatter=None)
    if inputs.is_batch():
        for i, body in enumerate(bodies):
            out.add_as_json(body, batch_index=i)
    else:
        out.add_as_json(bodies[0])
    return out
