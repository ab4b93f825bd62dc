"""Mirror of ``vllm.engine.arg_utils``: ``EngineArgs`` and ``AsyncEngineArgs``, dataclasses, so unknown
fields raise TypeError."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class EngineArgs:
    """The subset of vLLM's engine arguments that djl_handlers sets (same names and defaults)."""

    model: str = "facebook/opt-125m"
    tokenizer: Optional[str] = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    seed: Optional[int] = 0
    max_model_len: Optional[int] = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    block_size: Optional[int] = None
    swap_space: float = 4
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: Optional[int] = None
    max_num_seqs: Optional[int] = None
    max_logprobs: int = 20
    quantization: Optional[str] = None
    enforce_eager: bool = False
    enable_prefix_caching: Optional[bool] = None
    enable_chunked_prefill: Optional[bool] = None
    load_format: str = "auto"
    revision: Optional[str] = None
    disable_log_stats: bool = False
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None


@dataclass
class AsyncEngineArgs(EngineArgs):
    """Arguments for the asynchronous engine (``AsyncLLM``): ``EngineArgs`` plus request logging."""

    enable_log_requests: bool = False
