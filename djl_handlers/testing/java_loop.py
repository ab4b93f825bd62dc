"""An in-process emulation of DJL Serving's Java rolling-batch and dynamic-batch drivers.

``RollingBatchDriver`` does what ``RollingBatch.java`` does: each step it sends the whole list
of in-flight requests as one batch Input — a new request's properties, body and random seed on
its first step only, empty bodies afterwards — decodes one record per position, appends ``data``
to that request's body, and drops requests whose record says ``last``. Handy for unit tests and
for ``djl-handlers generate``. :func:`dynamic_batch` sends JSON bodies as one dynamic batch, the way
DJL's batcher does without rolling batch.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from djl_handlers.extensions import CANCEL_PROPERTY
from djl_handlers.io.inputs import Input
from djl_handlers.io.wire import binary_decode

Handler = Callable[[Any], Any]


def dynamic_batch(handle: Handler, bodies: list[Any]) -> list[Any]:
    """Send ``bodies`` (JSON values) to ``handle`` as one dynamic batch (``batch_size`` N,
    ``batch_NNN.data`` and a JSON Content-Type per position) and return each position's decoded
    JSON answer (an error is ``{"code": ..., "error": ...}``)."""
    props = {"batch_size": str(len(bodies))}
    content: list[tuple[Optional[str], bytes]] = []
    for i, body in enumerate(bodies):
        props[f"batch_{i:03d}.Content-Type"] = "application/json"
        content.append((f"batch_{i:03d}.data", json.dumps(body).encode("utf-8")))
    out = handle(Input.from_parts(props, content))
    return [json.loads(bytes(out.content.value_at(i))) for i in range(len(bodies))]


@dataclass
class DriverRequest:
    """One client request as the Java side tracks it."""

    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    chunks: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    done: bool = False
    code: Optional[int] = None
    error: Optional[str] = None
    first_step: bool = True
    cancel: bool = False
    records: list[dict[str, Any]] = field(default_factory=list)  # every record the handler sent for it

    @property
    def text(self) -> str:
        return "".join(self.chunks)


def json_request(payload: Any, **properties: str) -> DriverRequest:
    """A request with a JSON body and a Content-Type property."""
    props = {"Content-Type": "application/json", **properties}
    return DriverRequest(json.dumps(payload).encode("utf-8"), props)


class RollingBatchDriver:
    """Drives a handler's rolling batch the way DJL's Java front end does."""

    def __init__(self, handle: Handler, rng: Optional[random.Random] = None) -> None:
        self.handle = handle
        self.active: list[DriverRequest] = []
        self.rng = rng or random.Random(0)
        self.steps = 0
        self.reset_next = False

    def init(self, options: Mapping[str, str]) -> Any:
        """The empty init call carrying the model's options."""
        return self.handle(Input.from_parts(dict(options), ()))

    def submit(self, request: DriverRequest) -> DriverRequest:
        self.active.append(request)
        return request

    def _batch_input(self) -> Input:
        props: dict[str, str] = {"batch_size": str(len(self.active))}
        if self.reset_next:
            props["reset_rollingbatch"] = "true"
            self.reset_next = False
        content: list[tuple[Optional[str], bytes]] = []
        for i, req in enumerate(self.active):
            prefix = f"batch_{i:03d}."
            if req.first_step:
                props.update({prefix + k: v for k, v in req.properties.items()})
                content.append((prefix + "data", req.body))
                content.append((prefix + "seed", str(self.rng.randrange(1 << 31)).encode()))
                req.first_step = False
            else:
                content.append((prefix + "data", b""))
            if req.cancel:
                props[prefix + CANCEL_PROPERTY] = "true"
        return Input.from_parts(props, content)

    def step(self) -> None:
        """One call of the handler with the whole in-flight list."""
        self.steps += 1
        out = self.handle(self._batch_input())
        if out.code >= 300 or out.content.size() != len(self.active):
            for req in self.active:
                req.done, req.code, req.error = True, out.code, out.message
            self.active = []
            self.reset_next = True
            return
        props = out.get_properties() if hasattr(out, "get_properties") else out.properties
        for i, req in enumerate(self.active):
            record = binary_decode(bytes(out.content.value_at(i)))
            req.records.append(record)
            prefix = f"batch_{i}_"
            req.headers.update({k[len(prefix):]: str(v) for k, v in props.items() if k.startswith(prefix)})
            if "code" in record:
                req.code, req.error, req.done = int(record["code"]), record.get("error", ""), True
                continue
            if record.get("data"):
                req.chunks.append(record["data"])
            req.done = record.get("last", "False").lower() == "true"
        self.active = [r for r in self.active if not r.done]

    def run(self, max_steps: int = 10_000) -> None:
        """Step until every submitted request finished."""
        while self.active and self.steps < max_steps:
            self.step()
