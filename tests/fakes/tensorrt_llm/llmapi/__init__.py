"""Mirror of ``tensorrt_llm.llmapi``: ``LLM``, its outputs and the config objects djl_handlers sets."""

from dataclasses import dataclass, field
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
class LoraConfig:
    """Mirror of ``tensorrt_llm.llmapi.LoraConfig`` (TensorRT-LLM 1.x; the fields djl_handlers sets)."""

    lora_dir: list = field(default_factory=list)
    lora_ckpt_source: str = "hf"
    max_lora_rank: int = 64
    max_loras: Optional[int] = None
    max_cpu_loras: Optional[int] = None


@dataclass
class LoRARequest:
    """Mirror of ``tensorrt_llm.llmapi.LoRARequest(lora_name, lora_int_id, lora_path='', lora_ckpt_source='hf')``."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path


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
    "LoRARequest",
    "LoraConfig",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
]
