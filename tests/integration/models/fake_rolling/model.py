"""Fake rolling-batch handler for server tests: emits N JSON-line tokens per request.

Body ``{"inputs": str, "parameters": {"max_new_tokens": N, "fail_at": K, "content_type": CT}}``.
Each step emits one record per in-flight request (``Output.binary_encode``), with
``batch_{i}_Content-Type``. ``fail_at=K`` sends a ``code=424`` record after K tokens. Options:
``fake_delay`` (seconds per step), ``pause_file`` (while it exists, requests past their first token
emit empty records), ``cancel_log`` (file to which cancelled prompts are appended; honours
``djl_handlers_cancel``). Positional identity as DJL: new requests are the indices past the tracked ones.
"""

import json
import os
import time

from djl_handlers.io import Output

_STATE = {"options": None, "active": []}


def _new_request(item):
    body = json.loads(item.get_as_string("data") or "{}")
    params = body.get("parameters", {})
    return {
        "prompt": body.get("inputs", ""),
        "n": int(params.get("max_new_tokens", 5)),
        "fail_at": params.get("fail_at"),
        "ct": params.get("content_type", "application/jsonlines"),
        "seed": item.get_as_string("seed"),
        "i": 0,
        "cancel": False,
        "done": False,
    }


def _record(req, options):
    if req["cancel"]:
        log = options.get("cancel_log")
        if log:
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(req["prompt"] + "\n")
        return {"data": "", "last": True}
    if req["fail_at"] is not None and req["i"] >= int(req["fail_at"]):
        return {"data": "", "last": True, "code": 424, "error": f"fake failure at token {req['i']}"}
    pause = options.get("pause_file")
    if pause and req["i"] >= 1 and os.path.exists(pause):
        return {"data": "", "last": False}
    line = json.dumps({"prompt": req["prompt"], "token": req["i"], "seed": req["seed"]}) + "\n"
    req["i"] += 1
    return {"data": line, "last": req["i"] >= req["n"]}


def handle(inputs):
    """One rolling-batch step."""
    props = inputs.get_properties()
    if _STATE["options"] is None:
        _STATE["options"] = dict(props)
    if inputs.is_empty():
        return None
    options = _STATE["options"]
    if props.get("reset_rollingbatch") == "true":
        _STATE["active"] = []
    active = _STATE["active"]
    batches = inputs.get_batches()
    for item in batches[len(active):]:
        active.append(_new_request(item))
    for index, item in enumerate(batches):
        if item.get_property("djl_handlers_cancel") == "true":
            active[index]["cancel"] = True
    delay = float(options.get("fake_delay", "0"))
    if delay:
        time.sleep(delay)
    out = Output()
    for index, req in enumerate(active):
        record = _record(req, options)
        req["done"] = record["last"]
        out.add(Output.binary_encode(record), key="data", batch_index=index)
        out.add_property(f"batch_{index}_Content-Type", req["ct"])
    _STATE["active"] = [req for req in active if not req["done"]]
    return out
