"""Beam search (``num_beams`` > 1) on vLLM, through vLLM's own beam search: the loop its OpenAI server
runs for ``use_beam_search`` (``BeamSearchOnlineMixin.beam_search`` over the ``AsyncLLM``, as in vLLM 0.32),
with ``BeamSearchParams`` from :func:`djl_handlers.params.translate.to_vllm_beam_search`.

vLLM's loop asks its engine for one token per beam per step (``logprobs = 2 x beam_width``), keeps the
best ``beam_width`` candidates by cumulative log-probability, and at the end sorts the finished and
running beams by ``cumulative log-prob / length ** length_penalty``; it yields once, at the end. So
a beam request on vLLM streams nothing until it is done (then every token at once, the best beam
first); the ``n`` best sequences (``n`` <= ``num_beams``) come under the request's sample ids. Async
mode (``option.async_mode=true``) runs this loop for a request without ``early_stopping``; the
synchronous ``LLMEngine`` adapter runs the same rule itself (``vllm_beam_rules.VllmRule``, driven by
``vllm_beam_sync``), and a request with ``early_stopping`` gets transformers' rule in both modes
(``vllm_beam_loop``). A prompt with images goes to the loop as vLLM's rendered input
(``vllm_media.rendered_prompt``), as vLLM's server passes it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.engines.external.vllm_beam_rules import sequence_outputs
from djl_handlers.engines.external.vllm_media import has_images, rendered_prompt
from djl_handlers.params.translate import to_vllm_beam_search

__all__ = ["beam_search_outputs", "is_beam_search", "searcher"]


def is_beam_search(request: EngineRequest) -> bool:
    """Whether ``request`` asks for beam search."""
    return bool(to_vllm_beam_search(request.params))


def searcher(engine: Any) -> Any:
    """An object with vLLM's beam-search loop bound to ``engine`` (its renderer and engine client)."""
    from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin

    class _Beams(BeamSearchOnlineMixin):
        def __init__(self) -> None:
            self.engine_client = engine
            self.renderer = engine.renderer

    return _Beams()


async def beam_search_outputs(engine: Any, request: EngineRequest,
                              lora_request: Any = None) -> AsyncIterator[list[StepOutput]]:
    """Run ``request``'s beam search in vLLM (with the request's LoRA adapter, if any); yields, at the
    end, the token outputs of its ``n`` best sequences (sequence ``i`` under ``[request_id, *sample_ids][i]``)."""
    from vllm.sampling_params import BeamSearchParams

    params = BeamSearchParams(**to_vllm_beam_search(request.params))
    prompt: Any = {"type": "token", "prompt_token_ids": list(request.prompt_ids)}
    if has_images(request):
        prompt = await rendered_prompt(engine, request)
    ids = [request.request_id, *request.sample_ids]
    async for output in searcher(engine).beam_search(prompt, str(request.request_id), params,
                                                          lora_request=lora_request):
        if not output.finished:
            continue
        outs: list[StepOutput] = []
        for rid, comp in zip(ids, output.outputs, strict=False):
            outs += sequence_outputs(rid, comp)
        yield outs

