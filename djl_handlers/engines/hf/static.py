"""Dynamic-batch mode for the transformers engine: ``model.generate()`` on left-padded batches.

Requests with identical sampling settings (and structured-output constraint: one grammar matcher
per row, applied by a logits processor) share one ``generate()`` call; each result is then cut
to its own ``max_new_tokens`` and first eos, and the slot logic (stops, text) runs on it as for
the rolling batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from djl_handlers.engines.base import EngineRequest, StepOutput, check_prompt_length
from djl_handlers.engines.hf.batch import generate_key, left_pad, static_outputs
from djl_handlers.engines.hf.lora import require_lora
from djl_handlers.errors import PromptTooLong, message_of
from djl_handlers.params.translate import translate

BEAMS_NEED_ROLLING_BATCH = ("parameters.num_beams > 1 needs the rolling batch (option.rolling_batch=auto or "
                            "huggingface): dynamic batching does not run beam search")


def generate_static(engine: Any, requests: Sequence[EngineRequest]) -> list[list[StepOutput]]:
    """Dynamic-batch mode: ``model.generate()`` on left-padded batches.

    Requests with identical sampling settings share one ``generate()`` call (run to the
    group's largest ``max_new_tokens``, then each cut to its own limit and first eos, which is
    exact because later tokens never change earlier ones). Returns one list per request, in
    order, of per-token outputs; the last one carries ``finish_reason`` (``eos_token`` or
    ``length``). A prompt that does not fit ``max_model_len`` gets a single error output.
    """
    results: list[list[StepOutput]] = [[] for _ in requests]
    groups: dict[tuple[Any, ...], list[int]] = {}
    limits: dict[int, int] = {}
    for i, req in enumerate(requests):
        try:
            check_prompt_length(len(req.prompt_ids), engine.max_model_len)
        except PromptTooLong as exc:
            results[i] = [StepOutput(req.request_id, error=exc.message)]
            continue
        if req.adapter:  # LoRA: rows of one generate() may use different adapters (engines/hf/lora.py)
            try:
                require_lora(engine).resolve(req.adapter)
            except Exception as exc:  # noqa: BLE001 - this request's own error
                results[i] = [StepOutput(req.request_id, error=message_of(exc))]
                continue
        settings = translate(req.params, engine.name)  # to_hf / to_deepspeed: the one greedy rule
        if settings["num_beams"] > 1:  # beams live in the running batch (engines/hf/beam_rows.py)
            results[i] = [StepOutput(req.request_id, error=BEAMS_NEED_ROLLING_BATCH)]
            continue
        limits[i] = int(settings["max_new_tokens"])
        constraint = req.params.structured_output
        groups.setdefault((generate_key(settings, req.params.seed), constraint), []).append(i)
    with torch.inference_mode():
        for (key, constraint), members in groups.items():
            batch = [requests[i] for i in members]
            kwargs = dict(key)
            processors = _penalty_processor(engine, kwargs, len(batch))
            if constraint is not None:
                processors += _grammar_processor(engine, constraint, len(batch))
            if processors:
                kwargs["logits_processor"] = processors
            outputs = _generate_group(engine, batch, [limits[i] for i in members], kwargs)
            for i, outs in zip(members, outputs, strict=True):
                results[i] = outs
    return results


def _generate_group(
    engine: Any, batch: list[EngineRequest], limits: list[int], kwargs: dict[str, Any]
) -> list[list[StepOutput]]:
    width = max(len(r.prompt_ids) for r in batch)
    pad = _pad_id(engine.tokenizer, engine.eos_token_ids)
    ids, mask = left_pad([r.prompt_ids for r in batch], pad)
    if engine.lora is not None:
        engine.lora.use([engine.lora.resolve(r.adapter) if r.adapter else None for r in batch])
    seed = kwargs.pop("seed", None)
    if seed is not None:
        torch.manual_seed(int(seed))
    if getattr(engine, "kv_dtype", None) is not None:  # option.kv_cache_dtype: generate() fills a 16-bit slab
        kwargs[engine._cache_kw] = engine.new_cache()  # the cache argument's name in this transformers
    out = engine.model.generate(
        input_ids=ids.to(engine.device),
        attention_mask=mask.to(engine.device),
        max_new_tokens=max(1, min(max(limits), engine.max_model_len - width)),
        eos_token_id=sorted(engine.eos_token_ids) or None,
        pad_token_id=pad,
        return_dict_in_generate=True,
        output_logits=True,
        **kwargs,
    )
    ids_by_request = [r.request_id for r in batch]
    return static_outputs(ids_by_request, out.sequences[:, width:], out.logits, limits, engine.eos_token_ids)


def _penalty_processor(engine: Any, kwargs: dict[str, Any], rows: int) -> Any:
    """A ``LogitsProcessorList`` with the group's frequency/presence penalties and bad words (the
    keys ``generate()`` does not take, popped from ``kwargs``); empty when it has none."""
    from transformers import LogitsProcessorList

    from djl_handlers.engines.hf.penalties import GeneratePenalties

    names = ("presence_penalty", "frequency_penalty", "bad_words")
    extras: dict[str, Any] = {k: kwargs.pop(k) for k in names if k in kwargs}
    if not extras:
        return LogitsProcessorList()
    vocab = int(engine._vocab)
    return LogitsProcessorList([GeneratePenalties(extras, rows, vocab, engine.tokenizer)])


def _grammar_processor(engine: Any, constraint: Any, rows: int) -> Any:
    """A ``LogitsProcessorList`` holding one grammar matcher per row of the group (all rows of a
    group share the constraint, so it is compiled once)."""
    from transformers import LogitsProcessorList

    from djl_handlers.engines.hf.grammar import GrammarLogitsProcessor

    backend = engine.grammar_backend()
    compiled = backend.submit(constraint).result()
    return LogitsProcessorList([GrammarLogitsProcessor([backend.matcher(compiled) for _ in range(rows)])])


def _pad_id(tokenizer: Any, eos_ids: frozenset[int]) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    if isinstance(pad, int):
        return pad
    return min(eos_ids) if eos_ids else 0
