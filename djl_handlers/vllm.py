"""Entry point `option.entryPoint=djl_handlers.vllm`: vLLM (also serves option.rolling_batch=lmi-dist).

DJL Serving calls ``handle(inputs)``; the service is built on the first call from the init
call's properties. Importing this module does no work and imports no engine library.
"""

from __future__ import annotations

from djl_handlers.service import LazyService

_service = LazyService("vllm")

handle, register_adapter, update_adapter, unregister_adapter = _service.entry_points()
djl_handlers_query = _service.query_point()  # the local server's tokenize/info routes (djl_handlers only)
