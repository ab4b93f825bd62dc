"""Beam search (``num_beams`` > 1) on vLLM, through vLLM's own beam search: the loop its OpenAI server
runs for ``use_beam_search`` (``BeamSearchOnlineMixin.beam_search`` over the ``AsyncLLM``, as in vLLM 0.32),
with ``BeamSearchParams`` from :func:`djl_handlers.params.translate.to_vllm_beam_search`.

vLLM's loop asks its engine for one token per beam per step (``logprobs = 2 x beam_width``), keeps the
best ``beam_width`` candidates by cumulative log-probability, and at the end sorts the finished and
running beams by ``cumulative log-prob / length ** length_penalty``; it yields once, at the end. So
a beam request on vLLM streams nothing until it is done (then every token at once, the best beam
first); the ``n`` best sequences (``n`` <= ``num_beams``) come under the request's sample ids. Only
async mode (``option.async_mode=true``) has this loop: vLLM runs it on its asynchronous engine, and
the synchronous ``LLMEngine`` adapter answers a 400 (:func:`refuse_in_sync_mode`). A prompt with images
goes to the loop as vLLM's rendered input (``vllm_media.rendered_prompt``), as vLLM's server passes it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.engines.external.vllm_media import has_images, rendered_prompt
from djl_handlers.engines.external.vllm_outputs import map_finish_reason
from djl_handlers.errors import InvalidParameter
from djl_handlers.params.translate import to_vllm_beam_search

__all__ = ["beam_search_outputs", "is_beam_search", "refuse_in_sync_mode", "searcher"]


def is_beam_search(request: EngineRequest) -> bool:
    """Whether ``request`` asks for beam search."""
    return bool(to_vllm_beam_search(request.params))


def refuse_in_sync_mode(request: EngineRequest) -> None:
    """400 naming ``num_beams``: vLLM's beam search is a loop over its asynchronous engine."""
    if is_beam_search(request):
        raise InvalidParameter(
            "parameters.num_beams > 1 is not supported by vLLM's synchronous engine: vLLM's beam search is a "
            "loop over its asynchronous engine (as its OpenAI server runs it); set option.async_mode=true",
            field="num_beams",
        )


def searcher(engine: Any) -> Any:
    """An object with vLLM's beam-search loop bound to ``engine`` (its renderer and engine client)."""
    from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin

    class _Beams(BeamSearchOnlineMixin):
        def __init__(self) -> None:
            self.engine_client = engine
            self.renderer = engine.renderer

    return _Beams()


async def beam_search_outputs(engine: Any, request: EngineRequest) -> AsyncIterator[list[StepOutput]]:
    """Run ``request``'s beam search in vLLM; yields, at the end, the token outputs of its ``n`` best
    sequences (sequence ``i`` under ``[request_id, *sample_ids][i]``)."""
    from vllm.sampling_params import BeamSearchParams

    params = BeamSearchParams(**to_vllm_beam_search(request.params))
    prompt: Any = {"type": "token", "prompt_token_ids": list(request.prompt_ids)}
    if has_images(request):
        prompt = await rendered_prompt(engine, request)
    ids = [request.request_id, *request.sample_ids]
    async for output in searcher(engine).beam_search(prompt, str(request.request_id), params):
        if not output.finished:
            continue
        outs: list[StepOutput] = []
        for rid, comp in zip(ids, output.outputs, strict=False):
            outs += _sequence(rid, comp)
        yield outs


def _sequence(rid: int, comp: Any) -> list[StepOutput]:
    """One returned beam as token outputs, its finish reason on the last (eos: the eos token itself
    when vLLM left it out of the tokens)."""
    if comp.finish_reason == "error":
        return [StepOutput(rid, error="vLLM's beam search failed")]
    reason = map_finish_reason(comp.finish_reason, comp.stop_reason)
    tokens = list(comp.token_ids)
    steps = list(comp.logprobs or [])
    if reason == "eos_token" and isinstance(comp.stop_reason, int) and (not tokens or tokens[-1] != comp.stop_reason):
        tokens.append(comp.stop_reason)
    outs = []
    for j, token in enumerate(tokens):
        entry = steps[j].get(token) if j < len(steps) else None
        outs.append(StepOutput(rid, token_id=token, log_prob=getattr(entry, "logprob", None)))
    if not outs:
        return [StepOutput(rid, error="vLLM's beam search returned no tokens")]
    last = outs[-1]
    outs[-1] = StepOutput(rid, token_id=last.token_id, log_prob=last.log_prob, finish_reason=reason or "length")
    return outs
