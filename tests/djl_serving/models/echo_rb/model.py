"""Rolling-batch echo handler written against DJL's own ``djl_python`` API.

Each request body is JSON ``{"inputs": "w1 w2 w3", ...}``; every rolling-batch step emits the
next word as a ``data`` record (``Output.binary_encode``), ``last`` on the final word, so a
three-word prompt streams over three steps. Request ids are positional, exactly as DJL's
RollingBatch.java keeps them. Behaviour switches in the body:
  ``mode: "code"``       -> the first record is ``{"code": <code>, "error": ..., "last": True}``;
  ``mode: "code_later"`` -> one data record, then a code/error record;
  ``mode: "raise"``      -> the handler raises (the whole batch fails);
  ``header_each_step``   -> also sets ``batch_{i}_X-Echo-Step`` on every step.
"""

from __future__ import annotations

import json
from typing import Any

from djl_python import Input, Output

_INIT: dict[str, str] = {}
_ACTIVE: list[dict[str, Any]] = []
_STEPS: list[dict[str, Any]] = []


def _content_keys(inp: Input) -> list[str]:
    content = inp.get_content()
    return [content.key_at(i) for i in range(content.size())]


def _new_request(item: Input) -> dict[str, Any]:
    body = json.loads(item.get_as_bytes() or b"{}")
    return {
        "words": str(body.get("inputs", "")).split() or [""],
        "mode": body.get("mode", ""),
        "code": int(body.get("code", 424)),
        "header_each_step": bool(body.get("header_each_step")),
        "step": 0,
        "first_properties": dict(item.get_properties()),
        "first_content_keys": _content_keys(item),
    }


def _record(req: dict[str, Any]) -> dict[str, Any]:
    step = req["step"]
    req["step"] += 1
    if req["mode"] == "code" or (req["mode"] == "code_later" and step == 1):
        req["done"] = True
        return {"data": "", "last": True, "code": req["code"], "error": "echo rolling error"}
    last = req["step"] >= len(req["words"])
    req["done"] = last
    text = req["words"][step] + ("" if last else " ")
    if step == 0 and req["mode"] == "props":
        text = (
            json.dumps(
                {"init": _INIT, "first": req["first_properties"], "content_keys": req["first_content_keys"]}
            )
            + "\n"
        )
    return {"data": text, "last": last}


def handle(inputs: Input) -> Output | None:
    """DJL entry point for a rolling-batch model: one call is one step over all requests."""
    if not _INIT:
        _INIT.update(inputs.get_properties())
    if inputs.is_empty():
        return None
    if inputs.get_property("reset_rollingbatch"):
        _ACTIVE.clear()
    items = inputs.get_batches()
    for item in items[len(_ACTIVE) :]:
        _ACTIVE.append(_new_request(item))
    if any(r["mode"] == "raise" for r in _ACTIVE):
        _ACTIVE.clear()
        raise RuntimeError("echo rolling batch failure requested")
    out = Output()
    for i, req in enumerate(_ACTIVE):
        out.add_property(f"batch_{i}_Content-Type", "application/x-echo")
        if req["header_each_step"]:
            out.add_property(f"batch_{i}_X-Echo-Step", str(req["step"]))
        out.add(Output.binary_encode(_record(req)))
    _ACTIVE[:] = [r for r in _ACTIVE if not r["done"]]
    return out
