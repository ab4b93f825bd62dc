"""Mirror of ``vllm.lora.request.LoRARequest`` (vLLM 0.1x-0.3x: ``lora_name``, ``lora_int_id`` > 0,
``lora_path`` defaulting to ``""``, optional ``base_model_name``; a msgspec Struct in vLLM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class LoRARequest:
    """Request for a LoRA adapter; ``lora_int_id`` must be globally unique and > 0."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: Optional[str] = None

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
