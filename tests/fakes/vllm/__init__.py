"""A FAKE of the ``vllm`` package for djl_handlers' unit tests (tests put ``tests/fakes`` on
sys.path; nothing else does). It mirrors the names, signatures and output objects of vLLM's
V1 engine API (vLLM 0.10-0.3x) that ``djl_handlers.engines.external`` uses — the synchronous
``LLMEngine`` (sync mode) and the asynchronous ``AsyncLLM`` (async mode) — on top of a
deterministic toy model. See ``vllm/engine/llm_engine.py`` and ``vllm/v1/engine/async_llm.py`` for
the behaviour they copy.
"""

from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.engine.llm_engine import LLMEngine
from vllm.inputs import TextPrompt, TokensPrompt
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

__version__ = "0.0.0+djl_handlers.fake"
IS_FAKE = True

__all__ = [
    "AsyncEngineArgs",
    "AsyncLLMEngine",
    "CompletionOutput",
    "EngineArgs",
    "LLMEngine",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "StructuredOutputsParams",
    "TextPrompt",
    "TokensPrompt",
]
