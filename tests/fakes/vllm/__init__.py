"""A FAKE of the ``vllm`` package for djl_handlers' unit tests (tests put ``tests/fakes`` on
sys.path; nothing else does). It mirrors the names, signatures and output objects of vLLM's
V1 engine API (vLLM 0.10-0.1x) that ``djl_handlers.engines.external.vllm`` uses, on top of a
deterministic toy model. See ``vllm/engine/llm_engine.py`` for the behaviour it copies.
"""

from vllm.engine.arg_utils import EngineArgs
from vllm.engine.llm_engine import LLMEngine
from vllm.inputs import TextPrompt, TokensPrompt
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

__version__ = "0.0.0+djl_handlers.fake"
IS_FAKE = True

__all__ = [
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
