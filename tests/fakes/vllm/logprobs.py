"""Mirror of ``vllm.logprobs`` (vLLM 0.10+): ``Logprob`` and the list-of-dicts shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class Logprob:
    """Log-probability, vocabulary rank and decoded text of one token."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[Optional[dict[int, Logprob]]]
