"""Entry point `option.entryPoint=djl_handlers.deepspeed`: DeepSpeed init_inference around the HF model.

DJL Serving calls ``handle(inputs)``; the service is built on the first call from the init
call's properties. Importing this module does no work and imports no engine library.
"""

from __future__ import annotations

from typing import Any

from djl_handlers.service import LazyService

_service = LazyService("deepspeed")


def handle(inputs: Any) -> Any:
    """DJL's handler function: returns an Output, or None for the empty init call."""
    return _service.handle(inputs)
