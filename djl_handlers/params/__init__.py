"""Generation parameters: one validated object per request and pure per-engine translations."""

from djl_handlers.params.generation import GenerationParameters, engine_defaults
from djl_handlers.params.translate import (
    SUPPORT,
    normalize_engine,
    supported_parameters,
    to_deepspeed,
    to_hf,
    to_trtllm,
    to_vllm,
    translate,
)

__all__ = [
    "SUPPORT",
    "GenerationParameters",
    "engine_defaults",
    "normalize_engine",
    "supported_parameters",
    "to_deepspeed",
    "to_hf",
    "to_trtllm",
    "to_vllm",
    "translate",
]
