"""Mirror of ``vllm.engine.async_llm_engine``: in V1 ``AsyncLLMEngine`` is an alias of ``AsyncLLM``."""

from vllm.v1.engine.async_llm import AsyncLLM

AsyncLLMEngine = AsyncLLM
