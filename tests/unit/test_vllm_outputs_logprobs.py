"""vLLM's ``logprobs`` / ``prompt_logprobs`` entries → ``top_tokens`` / ``prompt_logprobs`` of the step
outputs (the conversion alone, on vLLM's shapes: one dict of token id → ``Logprob`` per position;
``tests/vllm_cpu/test_vllm_cpu_logprobs.py`` runs it on real vLLM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from djl_handlers.engines.external.vllm_outputs import OutputTrack, completion_outputs
from djl_handlers.params.generation import GenerationParameters


@dataclass
class Logprob:
    """vLLM's ``Logprob`` fields."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


@dataclass
class Completion:
    """vLLM's ``CompletionOutput`` fields the conversion reads (cumulative outputs)."""

    token_ids: list[int]
    text: str
    logprobs: Optional[list[dict[int, Any]]] = None
    cumulative_logprob: Optional[float] = None
    finish_reason: Optional[str] = None
    stop_reason: Any = None
    index: int = 0


def entry(chosen: int, chosen_lp: float, *others: tuple[int, float]) -> dict[int, Logprob]:
    """One position as vLLM reports it: the top ones by rank, the sampled token added when outside."""
    out = {tid: Logprob(lp, rank) for rank, (tid, lp) in enumerate(others, start=1)}
    out.setdefault(chosen, Logprob(chosen_lp, 99))
    return out


def track(**params: Any) -> OutputTrack:
    return OutputTrack.for_request([1, 2, 3], GenerationParameters.from_dict(params, engine="vllm"))


def test_top_tokens_are_the_n_most_likely_without_the_sampled_token_added_beyond_them() -> None:
    t = track(top_n_tokens=2)
    comp = Completion([7, 8], "ab", [entry(7, -0.1, (7, -0.1), (5, -2.0)), entry(8, -3.0, (4, -0.5), (6, -1.0))])
    outs = completion_outputs(1, t, comp, False, None)
    assert [o.top_tokens for o in outs] == [[(7, -0.1), (5, -2.0)], [(4, -0.5), (6, -1.0)]]
    assert [o.log_prob for o in outs] == [-0.1, -3.0]


def test_prompt_log_probs_ride_on_the_first_output_only() -> None:
    t = track(decoder_input_details=True, top_n_tokens=1)
    prompt = [None, entry(2, -1.5, (9, -0.2)), entry(3, -0.7, (3, -0.7))]
    first = completion_outputs(1, t, Completion([7], "a", [entry(7, -0.1, (7, -0.1))]), False, None,
                               prompt_logprobs=prompt)
    assert first[0].prompt_logprobs == [None, -1.5, -0.7]
    assert first[0].prompt_top_tokens == [None, [(9, -0.2)], [(3, -0.7)]]
    later = completion_outputs(1, t, Completion([7, 8], "ab", [entry(7, -0.1), entry(8, -0.3)]), False, None,
                               prompt_logprobs=prompt)
    assert later[0].prompt_logprobs is None


def test_nothing_extra_for_a_request_that_asked_for_nothing() -> None:
    t = track()
    outs = completion_outputs(1, t, Completion([7], "a", [entry(7, -0.1, (7, -0.1))]), False, None,
                              prompt_logprobs=[None, entry(2, -1.5)])
    assert outs[0].top_tokens is None and outs[0].prompt_logprobs is None


def test_prompt_log_probs_with_lora_are_a_400_on_vllms_cpu_build_only() -> None:
    """vLLM's CPU build stops its engine on prompt log-probs with LoRA enabled: refused before it sees them."""
    import pytest

    from djl_handlers.engines.external.vllm_requests import refuse_prompt_logprobs_with_lora
    from djl_handlers.errors import InvalidParameter

    @dataclass
    class Sampling:
        prompt_logprobs: Optional[int]

    loras = object()
    with pytest.raises(InvalidParameter, match="option.enable_lora=true on vLLM's CPU build") as info:
        refuse_prompt_logprobs_with_lora(Sampling(prompt_logprobs=0), loras, on_cpu=True)
    assert info.value.field == "decoder_input_details"
    refuse_prompt_logprobs_with_lora(Sampling(prompt_logprobs=0), None, on_cpu=True)  # LoRA off
    refuse_prompt_logprobs_with_lora(Sampling(prompt_logprobs=None), loras, on_cpu=True)  # not asked
    refuse_prompt_logprobs_with_lora(Sampling(prompt_logprobs=1), loras, on_cpu=False)  # a GPU
