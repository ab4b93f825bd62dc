"""Mirror of ``tensorrt_llm.executor``."""

from tensorrt_llm.executor.result import CompletionOutput, GenerationResult, Logprob

__all__ = ["CompletionOutput", "GenerationResult", "Logprob"]
