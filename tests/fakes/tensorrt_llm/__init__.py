"""A FAKE of the ``tensorrt_llm`` package for djl_handlers' unit tests (tests put ``tests/fakes``
on sys.path; nothing else does). It mirrors the LLM API of TensorRT-LLM 0.17-1.x that
``djl_handlers.engines.external.trtllm`` uses (``LLM``, ``SamplingParams``, ``generate_async``
with ``streaming=True``, ``RequestOutput``/``CompletionOutput``, ``abort()``), over a
deterministic toy model and a background "executor" thread.
"""

from tensorrt_llm import llmapi
from tensorrt_llm.llmapi import LLM, CompletionOutput, RequestOutput, SamplingParams

__version__ = "0.0.0+djl_handlers.fake"
IS_FAKE = True

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "llmapi"]
