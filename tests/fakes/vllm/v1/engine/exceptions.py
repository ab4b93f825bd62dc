"""Mirror of ``vllm.v1.engine.exceptions``."""

from __future__ import annotations

from vllm.exceptions import VLLMError


class EngineGenerateError(VLLMError):
    """Raised when ``AsyncLLM.generate()`` fails (the original error is its ``__cause__``)."""


class EngineDeadError(VLLMError):
    """Raised when the engine core died."""
