"""djl_handlers: LLM inference handlers for DJL Serving's Python engine (LMI v0.27 schema).

Importing this package does no work and imports no ML library. Entry points for
``option.entryPoint`` are ``djl_handlers.huggingface``, ``djl_handlers.deepspeed``,
``djl_handlers.tensorrt_llm`` and ``djl_handlers.vllm``; each exposes ``handle(inputs)``.
"""

from djl_handlers.__about__ import __version__

__all__ = ["__version__"]
