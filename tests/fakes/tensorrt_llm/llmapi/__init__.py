"""Mirror of ``tensorrt_llm.llmapi``: ``LLM``, its outputs and the config objects djl_handlers sets."""

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from tensorrt_llm.executor.result import CompletionOutput
from tensorrt_llm.llmapi.llm import LLM, RequestOutput
from tensorrt_llm.sampling_params import GuidedDecodingParams, SamplingParams


@dataclass
class KvCacheConfig:
    """Mirror of ``tensorrt_llm.llmapi.KvCacheConfig`` (the fields djl_handlers sets)."""

    enable_block_reuse: bool = True
    max_tokens: Optional[int] = None
    free_gpu_memory_fraction: Optional[float] = None


class CapacitySchedulerPolicy(Enum):
    """Mirror of ``tensorrt_llm.llmapi.CapacitySchedulerPolicy``."""

    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


@dataclass
class SchedulerConfig:
    """Mirror of ``tensorrt_llm.llmapi.SchedulerConfig``."""

    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT


__all__ = [
    "LLM",
    "CapacitySchedulerPolicy",
    "CompletionOutput",
    "GuidedDecodingParams",
    "KvCacheConfig",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
]
