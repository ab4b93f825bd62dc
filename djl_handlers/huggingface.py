"""Entry point `option.entryPoint=djl_handlers.huggingface`: transformers + accelerate, continuous batching.

DJL Serving calls ``handle(inputs)``; the service is built on the first call from the init
call's properties. Importing this module does no work and imports no engine library.
"""

from __future__ import annotations

from djl_handlers.service import LazyService

_service = LazyService("huggingface")

handle, register_adapter, update_adapter, unregister_adapter = _service.entry_points()
djl_handlers_query = _service.query_point()  # the local server's tokenize/info routes (djl_handlers only)
