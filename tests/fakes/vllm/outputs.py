"""Mirror of ``vllm.outputs`` (V1 engine, vLLM 0.10-0.3x): ``CompletionOutput``, ``RequestOutput``
(with ``add``, which ``AsyncLLM`` uses to merge the outputs a slow reader has not taken yet)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

from vllm.logprobs import PromptLogprobs, SampleLogprobs


@dataclass
class CompletionOutput:
    """One completion of a request (same fields and order as vLLM's)."""

    index: int
    text: str
    token_ids: Sequence[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    lora_request: Any = None

    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestOutput:
    """The output of one request for one engine step."""

    def __init__(
        self,
        request_id: str,
        prompt: Optional[str],
        prompt_token_ids: Optional[list[int]],
        prompt_logprobs: Optional[PromptLogprobs],
        outputs: list[CompletionOutput],
        finished: bool,
        metrics: Any = None,
        lora_request: Any = None,
        encoder_prompt: Optional[str] = None,
        encoder_prompt_token_ids: Optional[list[int]] = None,
        num_cached_tokens: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished
        self.metrics = metrics
        self.lora_request = lora_request
        self.encoder_prompt = encoder_prompt
        self.encoder_prompt_token_ids = encoder_prompt_token_ids
        self.num_cached_tokens = num_cached_tokens

    def add(self, next_output: RequestOutput, aggregate: bool) -> None:
        """Merge a later output of the same request into this one (vLLM's rule: with ``aggregate``,
        DELTA outputs, text, token ids and log-probs are appended; else the completion is replaced)."""
        self.finished |= next_output.finished
        for nxt in next_output.outputs:
            for i, comp in enumerate(self.outputs):
                if comp.index != nxt.index:
                    continue
                if aggregate:
                    comp.text += nxt.text
                    comp.token_ids = list(comp.token_ids) + list(nxt.token_ids)
                    if nxt.logprobs:
                        assert comp.logprobs is not None
                        comp.logprobs.extend(nxt.logprobs)
                    comp.cumulative_logprob = nxt.cumulative_logprob
                    comp.finish_reason, comp.stop_reason = nxt.finish_reason, nxt.stop_reason
                else:
                    self.outputs[i] = nxt
                break
            else:
                self.outputs.append(nxt)

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id}, prompt={self.prompt!r}, "
            f"outputs={self.outputs}, finished={self.finished})"
        )
