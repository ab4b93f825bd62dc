"""Fake dynamic-batch echo handler: each request gets back what the handler saw, plus batch_size.

Header ``x-fake-action``: ``raise`` (RuntimeError → 424 for the whole batch), ``oom`` (MemoryError →
507), ``none`` (return None → 204), ``sleep`` (sleep 60 s: lets a test kill the worker mid-call).
Header ``x-want-type`` sets that request's Content-Type (``batch_{i}_Content-Type``).
"""

import os
import time

from djl_handlers.io import Output

_STATE = {"init": None}


def _echo(item, size, props):
    content = {}
    for key in item.get_content().get_keys():
        content[key] = item.get_as_string(key)
    return {"batch_size": size, "properties": dict(item.get_properties()), "content": content,
            "pid": os.getpid(), "cwd": os.getcwd(), "init": _STATE["init"], "top": dict(props)}


def handle(inputs):
    """Echo every request of the (possibly batched) Input."""
    props = inputs.get_properties()
    if _STATE["init"] is None:
        _STATE["init"] = dict(props)
    if inputs.is_empty():
        return None
    batches = inputs.get_batches()
    actions = {item.get_property("x-fake-action") for item in batches}
    if "raise" in actions:
        raise RuntimeError("fake handler failure")
    if "oom" in actions:
        raise MemoryError("fake out of memory")
    if "none" in actions:
        return None
    if "sleep" in actions:
        time.sleep(60)
    out = Output()
    batched = inputs.is_batch()
    for index, item in enumerate(batches):
        body = _echo(item, len(batches), props)
        want = item.get_property("x-want-type") or "application/json"
        if batched:
            out.add_as_json(body, key="data", batch_index=index)
            out.add_property(f"batch_{index}_Content-Type", want)
        else:
            out.add_as_json(body)
            out.add_property("Content-Type", want)
    return out
