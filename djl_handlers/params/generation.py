"""GenerationParameters: one frozen, validated object per request.

PLACEHOLDER written by the lead so other modules can code against the field names; the params
owner replaces the body (validation, engine defaults, unknown-key rule) keeping these names.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class GenerationParameters:
    # common (every engine)
    do_sample: bool = False
    seed: Optional[int] = None
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 30
    details: bool = False
    return_full_text: bool = False
    stop_sequences: tuple[str, ...] = ()
    # DeepSpeed / HF / lmi-dist
    typical_p: float = 1.0
    truncate: Optional[int] = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], engine: str = "huggingface") -> "GenerationParameters":
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        if "stop_sequences" in kwargs and kwargs["stop_sequences"] is not None:
            kwargs["stop_sequences"] = tuple(kwargs["stop_sequences"])
        return cls(**kwargs)
