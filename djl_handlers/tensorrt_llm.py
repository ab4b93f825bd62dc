"""Entry point `option.entryPoint=djl_handlers.tensorrt_llm`: TensorRT-LLM through its LLM API.

DJL Serving calls ``handle(inputs)``; the service is built on the first call from the init
call's properties. Importing this module does no work and imports no engine library.
"""

from __future__ import annotations

from typing import Any

from djl_handlers.service import LazyService

_service = LazyService("tensorrt_llm")


def handle(inputs: Any) -> Any:
    """DJL's handler function: returns an Output, or None for the empty init call."""
    return _service.handle(inputs)


def register_adapter(inputs: Any) -> Any:
    """DJL's ``register_adapter`` call (properties ``name``, ``alias``, ``src``; ``preload``/``pin``)."""
    return _service.adapter_call("register", inputs)


def update_adapter(inputs: Any) -> Any:
    """DJL's ``update_adapter`` call."""
    return _service.adapter_call("update", inputs)


def unregister_adapter(inputs: Any) -> Any:
    """DJL's ``unregister_adapter`` call; requests already using the adapter finish with it."""
    return _service.adapter_call("unregister", inputs)
