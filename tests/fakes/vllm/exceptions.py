"""Mirror of ``vllm.exceptions`` (vLLM 0.11+): the request-error classes ``AsyncLLM`` raises as they are."""

from __future__ import annotations

from typing import Any, Optional


class VLLMError(Exception):
    """Base class for all vLLM-specific errors."""


class VLLMClientError(VLLMError):
    """Base class for errors caused by the client request (4xx)."""


class VLLMValidationError(VLLMClientError):
    """A request failed validation (not a ``ValueError``)."""

    def __init__(self, message: str, *, parameter: Optional[str] = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value
