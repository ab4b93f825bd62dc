"""Our own beam-search loop over vLLM's engine (both modes): which rule a request gets, what it may
combine, the one-token requests each step makes, and the asynchronous driver (the synchronous one is
``vllm_beam_sync``).

Which rule (:func:`beam_rule`):

- ``early_stopping`` given (``true``, ``false`` or ``"never"``): transformers' rule
  (:class:`~djl_handlers.engines.external.vllm_beam_transformers.TransformersRule`), what
  ``generate(num_beams=..., length_penalty=..., early_stopping=...)`` returns; settled tokens stream;
- otherwise vLLM's own rule: vLLM's loop itself in async mode (``vllm_beams``), its re-implementation
  (:class:`~djl_handlers.engines.external.vllm_beam_rules.VllmRule`) in sync mode, so that one request
  gets one answer in both modes.

Each step asks vLLM for one token per live beam: the prompt's ids and the beam's tokens,
``SamplingParams(max_tokens=1, temperature=0, logprobs=K, detokenize=False)`` (:func:`step_sampling`),
the request's LoRA adapter if any, under the id ``"<request id>-beam-<step>-<beam>"``. ``K`` is the
rule's: ``max(2, 1 + len(eos)) x num_beams`` for transformers', ``2 x num_beams`` for vLLM's; more than
vLLM's ``max_logprobs`` is a 400 naming ``num_beams`` (:func:`check_beams`).

What transformers' rule here may not combine (a 400 naming the field): what would change the scores
(``do_sample``, ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``, ``min_new_tokens``,
``bad_sequences``: vLLM reports log-probs before its processors), ``top_n_tokens``, structured output,
and images. vLLM's rule takes what vLLM's loop takes (and ignores what it ignores); images only in async
mode, where vLLM's loop renders them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from typing import Any, Optional

from djl_handlers.engines.base import EngineRequest, StepOutput
from djl_handlers.engines.external.vllm_beam_rules import (
    BeamRule,
    Tops,
    VllmRule,
    error_outputs,
)
from djl_handlers.engines.external.vllm_media import has_images
from djl_handlers.engines.external.vllm_requests import rejection
from djl_handlers.errors import InvalidParameter
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.params.translate import is_sampling

__all__ = ["beam_rule", "check_beams", "max_logprobs", "own_beam_outputs", "step_prompt", "step_sampling",
           "sub_request_id", "tops_of", "wants_transformers_rule"]


def wants_transformers_rule(params: GenerationParameters) -> bool:
    """Whether the request gave ``early_stopping`` (then transformers' rule; else vLLM's)."""
    return "early_stopping" in params.provided or params.early_stopping is not False


def max_logprobs(model_config: Any) -> int:
    """vLLM's ``max_logprobs`` (its ``-1``: the vocabulary)."""
    limit = int(getattr(model_config, "max_logprobs", 20))
    return int(model_config.get_vocab_size()) if limit == -1 else limit


def check_beams(request: EngineRequest, *, limit: int, eos_ids: Collection[int], sync: bool) -> None:
    """400 naming the field unless the beam request can run here (module docstring); ``limit``: vLLM's
    ``max_logprobs``."""
    p = request.params
    own = wants_transformers_rule(p)
    factor = max(2, 1 + (0 if p.ignore_eos_token else len(eos_ids))) if own else 2
    if factor * p.num_beams > limit:
        rule = "max(2, 1 + eos ids)" if own else "2"
        raise InvalidParameter(
            f"parameters.num_beams={p.num_beams} asks vLLM for the top {factor * p.num_beams} log-probs of each beam "
            f"({rule} x num_beams), more than its max_logprobs ({limit}): ask for at most {limit // factor} beams",
            field="num_beams")
    images = has_images(request)
    if images and (own or sync):
        raise InvalidParameter("parameters.num_beams > 1 with images runs only vLLM's own loop in async mode "
                               "(option.async_mode=true, without early_stopping)", field="num_beams")
    if not own:
        return
    refusals = (
        (is_sampling(p), "do_sample", "beam search is greedy (as transformers' generate(num_beams=...))"),
        (p.repetition_penalty != 1.0, "repetition_penalty", "vLLM reports log-probs before its penalties"),
        (p.presence_penalty != 0.0, "presence_penalty", "vLLM reports log-probs before its penalties"),
        (p.frequency_penalty != 0.0, "frequency_penalty", "vLLM reports log-probs before its penalties"),
        (p.min_new_tokens > 0, "min_new_tokens", "vLLM reports log-probs before it holds the eos off"),
        (bool(p.bad_sequences), "bad_sequences", "bad words are not applied to beams"),
        (p.top_n_tokens > 0, "top_n_tokens", "top tokens are not reported for beams"),
        (p.structured_output is not None, "num_beams", "structured output cannot be combined with beams"),
    )
    for refused, name, why in refusals:
        if refused:
            raise InvalidParameter(f"parameters.{name} cannot be used with num_beams={p.num_beams} and "
                                   f"early_stopping: {why}", field=name)


def beam_rule(request: EngineRequest, *, eos_ids: Collection[int], eos_token_id: Optional[int],
              max_model_len: int) -> BeamRule:
    """The request's rule (module docstring): ``eos_ids`` end transformers' hypotheses, the tokenizer's
    ``eos_token_id`` vLLM's."""
    p = request.params
    ids = [request.request_id, *request.sample_ids]
    if wants_transformers_rule(p):
        # torch: imported with the first request of this rule, never with the adapter
        from djl_handlers.engines.external.vllm_beam_transformers import TransformersRule
        from djl_handlers.engines.hf.beams import BeamSearch

        limit = max(1, min(p.max_new_tokens, max_model_len - len(request.prompt_ids)))
        search = BeamSearch(p.num_beams, limit, () if p.ignore_eos_token else eos_ids,
                            length_penalty=p.length_penalty, early_stopping=p.early_stopping, ids=ids)
        return TransformersRule(search)
    return VllmRule(list(request.prompt_ids), p.num_beams, p.max_new_tokens, eos_token_id, ids,
                    ignore_eos=p.ignore_eos_token, include_stop_str_in_output=p.include_stop_str_in_output,
                    length_penalty=p.length_penalty)


def step_sampling(vllm: Any, logprobs: int) -> Any:
    """The ``SamplingParams`` of every one-token request."""
    return vllm.SamplingParams(max_tokens=1, temperature=0.0, logprobs=logprobs, detokenize=False)


def step_prompt(request: EngineRequest, tokens: tuple[int, ...]) -> dict[str, Any]:
    """One beam's prompt: the request's prompt ids and the beam's tokens."""
    return {"prompt_token_ids": [*request.prompt_ids, *tokens]}


def sub_request_id(request_id: int, step: int, beam: int) -> str:
    return f"{request_id}-beam-{step}-{beam}"


def tops_of(output: Any) -> Optional[Tops]:
    """A finished one-token request's top log-probs in vLLM's order; None when it failed."""
    comp = output.outputs[0] if output is not None and output.outputs else None
    if comp is None or comp.finish_reason in ("error", "abort"):
        return None
    steps = comp.logprobs
    return {int(token): float(entry.logprob) for token, entry in steps[0].items()} if steps else {}


async def own_beam_outputs(engine: Any, request: EngineRequest, rule: BeamRule, sampling: Any,
                           lora: dict[str, Any]) -> AsyncIterator[list[StepOutput]]:
    """Drive ``rule`` over the ``AsyncLLM`` ``engine``: each step's one-token requests run together;
    yields the request's outputs as the rule gives them. A request vLLM rejects at the first step raises
    its 400 (``vllm_requests.rejection``)."""
    step = 0
    while not rule.done and rule.live:
        asks = rule.asks()
        tasks = [asyncio.ensure_future(_one_token(engine, step_prompt(request, ask), sampling,
                                                  sub_request_id(request.request_id, step, j), lora))
                 for j, ask in enumerate(asks)]
        try:
            results = await asyncio.gather(*tasks)
        except Exception as exc:
            error = rejection(exc, request.params) if step == 0 else None
            if error is None:
                raise
            raise error from exc
        finally:
            for task in tasks:
                task.cancel()
        tops = [tops_of(result) for result in results]
        if any(top is None for top in tops):
            yield error_outputs(rule.live, "vLLM failed a step of the beam search")
            return
        outs = rule.feed([top for top in tops if top is not None])
        step += 1
        if outs:
            yield outs


async def _one_token(engine: Any, prompt: dict[str, Any], sampling: Any, request_id: str,
                     lora: dict[str, Any]) -> Any:
    """The last ``RequestOutput`` of one one-token request (closing the stream aborts it in vLLM)."""
    stream = engine.generate(prompt, sampling, request_id, **lora)
    last = None
    try:
        async for output in stream:
            last = output
    finally:
        await stream.aclose()
    return last
