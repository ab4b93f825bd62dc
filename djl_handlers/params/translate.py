"""Pure per-engine translations of ``GenerationParameters``.

Every ``to_*`` function returns a plain dict of keyword arguments; nothing here imports an
engine library. Field names of the engine APIs live in the ``to_*`` bodies only. Engines read
their generation settings only through these functions (never from the request object), so one
rule — :func:`is_sampling` — decides greedy versus sampling for every engine. Which parameter each
engine supports is :mod:`djl_handlers.params.support`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from djl_handlers.params.samples import sample_count
from djl_handlers.params.support import (
    EMULATED,
    ENGINES,
    NATIVE,
    SUPPORT,
    UNSUPPORTED,
    known_parameters,
    normalize_engine,
    supported_parameters,
)

if TYPE_CHECKING:
    from djl_handlers.params.generation import GenerationParameters

__all__ = [
    "EMULATED", "ENGINES", "HF_EXTRAS", "NATIVE", "SUPPORT", "TRANSLATORS", "UNSUPPORTED", "is_sampling",
    "known_parameters", "min_tokens", "normalize_engine", "supported_parameters", "to_deepspeed", "to_hf",
    "to_trtllm", "to_vllm", "to_vllm_beam_search", "translate",
]


def is_sampling(p: GenerationParameters) -> bool:
    """The one greedy/sampling rule for every engine: sample only when ``do_sample`` is true and
    ``temperature > 0``. ``temperature: 0`` means greedy (as vLLM and OpenAI define it), with or
    without ``do_sample``."""
    return p.do_sample and p.temperature > 0


def to_hf(p: GenerationParameters) -> dict[str, Any]:
    """Keyword arguments for transformers ``model.generate``.

    ``top_k`` is always sent when sampling (transformers' own default is 50, ours is 0 = off);
    ``-1`` becomes 0. Sampling knobs are omitted for greedy decoding (transformers warns about
    them). Seed, stop sequences, eos handling and truncation are applied by djl_handlers.
    ``min_new_tokens`` is :func:`min_tokens`. vLLM's extras (:data:`HF_EXTRAS`: ``min_p`` when
    sampling, ``presence_penalty``, ``frequency_penalty``, ``bad_words``) are present only when they
    ask for something; the continuous-batching sampler implements them (``generate()`` has no
    presence/frequency penalty, so dynamic-batch mode refuses them).
    """
    kwargs: dict[str, Any] = {
        "max_new_tokens": p.max_new_tokens,
        "do_sample": is_sampling(p),
        "repetition_penalty": p.repetition_penalty,
        "num_beams": 1,
    }
    if min_tokens(p) > 0:
        kwargs["min_new_tokens"] = min_tokens(p)
    if p.num_beams > 1:  # beam search (the engine's beam rows: engines/hf/beam_rows.py)
        kwargs.update(num_beams=p.num_beams, length_penalty=p.length_penalty, early_stopping=p.early_stopping)
    if kwargs["do_sample"]:
        kwargs["temperature"] = p.temperature
        kwargs["top_k"] = max(p.top_k, 0)
        kwargs["top_p"] = p.top_p
        if p.typical_p < 1.0:
            kwargs["typical_p"] = p.typical_p
        if p.min_p > 0.0:
            kwargs["min_p"] = p.min_p
    if p.presence_penalty != 0.0:
        kwargs["presence_penalty"] = p.presence_penalty
    if p.frequency_penalty != 0.0:
        kwargs["frequency_penalty"] = p.frequency_penalty
    if p.bad_sequences:
        kwargs["bad_words"] = p.bad_sequences
    return kwargs


# to_hf keys the continuous-batching sampler implements and transformers' generate() does not take
HF_EXTRAS: Mapping[str, str] = {
    "min_p": "min_p", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "bad_words": "bad_sequences",
}


def min_tokens(p: GenerationParameters) -> int:
    """Generated tokens before eos or a stop may end the request: ``min_new_tokens``, or
    TensorRT-LLM's ``min_length`` when the client gave it (it counts generated tokens too; its
    default of 1 asks for nothing on the engines that do not default to it), whichever is larger."""
    length = p.min_length if "min_length" in p.provided else 0
    return max(p.min_new_tokens, length)


def to_deepspeed(p: GenerationParameters) -> dict[str, Any]:
    """Keyword arguments for the DeepSpeed inference engine's ``generate``.

    DeepSpeed's ``init_inference`` wraps the transformers model, so its ``generate`` takes the
    same keywords as ``to_hf``; the support table is identical.
    """
    return to_hf(p)


def to_vllm_beam_search(p: GenerationParameters) -> dict[str, Any]:
    """Keyword arguments for ``vllm.sampling_params.BeamSearchParams`` (vLLM's beam search, the loop of
    its OpenAI server) when ``num_beams`` > 1, else ``{}``: ``beam_width`` is ``num_beams``; greedy
    (``temperature`` 0: the beams read the model's own log-probabilities)."""
    if p.num_beams <= 1:
        return {}
    return {"beam_width": p.num_beams, "max_tokens": p.max_new_tokens, "ignore_eos": p.ignore_eos_token,
            "temperature": 0.0, "length_penalty": p.length_penalty,
            "include_stop_str_in_output": p.include_stop_str_in_output, "skip_special_tokens": p.skip_special_tokens}


def _vllm_logprobs(p: GenerationParameters) -> int:
    """Top log-probs per token: explicit ``logprobs``, else ``top_n_tokens``, else 1 (so every
    token carries its own log-prob, as the LMI token object needs)."""
    if p.logprobs is not None:
        return p.logprobs
    return p.top_n_tokens if p.top_n_tokens > 0 else 1


def to_vllm(p: GenerationParameters) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` (vLLM 0.10+ field names).

    Greedy (``is_sampling`` false) is ``temperature=0``; ``top_k <= 0`` becomes ``-1`` (accepted
    by every vLLM release as "off"). ``decoder_input_details`` asks for ``prompt_logprobs`` (1, or
    ``top_n_tokens``).
    ``structured_outputs`` (structured output) is a dict of ``StructuredOutputsParams`` keywords
    that the adapter wraps in the installed vLLM's class. ``n`` is every sample to decode
    (``best_of``, else ``n``: vLLM V1 has no ``best_of``; the scheduler ranks the samples and keeps
    the best, :mod:`djl_handlers.params.samples`).
    """
    kwargs: dict[str, Any] = {
        "n": sample_count(p),
        "max_tokens": p.max_new_tokens,
        "min_tokens": min_tokens(p),
        "temperature": p.temperature if is_sampling(p) else 0.0,
        "top_k": p.top_k if p.top_k > 0 else -1,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "repetition_penalty": p.repetition_penalty,
        "seed": p.seed,
        "stop": list(p.stop_sequences),
        "stop_token_ids": list(p.stop_token_ids),
        "ignore_eos": p.ignore_eos_token,
        "include_stop_str_in_output": p.include_stop_str_in_output,
        "logprobs": _vllm_logprobs(p),
        "skip_special_tokens": p.skip_special_tokens,
        "spaces_between_special_tokens": p.spaces_between_special_tokens,
    }
    prompt_logprobs = p.prompt_logprobs
    if prompt_logprobs is None and p.decoder_input_details:
        prompt_logprobs = max(p.top_n_tokens, 1)  # each prompt position's top N too (OpenAI echo)
    if prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = prompt_logprobs
    if p.bad_sequences:
        kwargs["bad_words"] = list(p.bad_sequences)
    if p.structured_output is not None:
        kwargs["structured_outputs"] = vllm_structured(p)
    return kwargs


def vllm_structured(p: GenerationParameters) -> dict[str, Any]:
    """Keyword arguments for vLLM's ``StructuredOutputsParams`` (``GuidedDecodingParams`` before
    0.11: the same five field names): exactly one of json/regex/choice/grammar/json_object."""
    c = p.structured_output
    assert c is not None
    if c.kind == "json":
        return {"json": c.schema}
    if c.kind == "choice":
        return {"choice": list(c.value or ())}
    if c.kind == "json_object":
        return {"json_object": True}
    return {c.kind: c.value}


def trtllm_structured(p: GenerationParameters) -> dict[str, Any]:
    """Keyword arguments for TensorRT-LLM's ``GuidedDecodingParams`` (json, regex, grammar,
    json_object); a choice becomes the regex that matches exactly one of the choices."""
    from djl_handlers.params.structured import choice_regex

    c = p.structured_output
    assert c is not None
    if c.kind == "json":
        return {"json": c.schema}
    if c.kind == "choice":
        return {"regex": choice_regex(tuple(c.value or ()))}
    if c.kind == "json_object":
        return {"json_object": True}
    return {c.kind: c.value}


# TensorRT-LLM: the seed says presence/length/frequency penalties "are ignored if not provided".
_TRT_OPTIONAL = ("presence_penalty", "frequency_penalty", "length_penalty")
# early_stopping as TensorRT-LLM's beam search reads it (an int): 1 ends once beam-width hypotheses
# finished (True), 0 the heuristic (False), larger values never end early ("never").
_TRT_EARLY_STOPPING: dict[bool | str, int] = {True: 1, False: 0, "never": 2}


def to_trtllm(p: GenerationParameters) -> dict[str, Any]:
    """Keyword arguments for ``tensorrt_llm.SamplingParams`` (LLM API).

    ``guided_decoding`` (structured output) is a dict of ``GuidedDecodingParams`` keywords that
    the adapter wraps. Temperature/top_k/top_p already carry TensorRT-LLM's own defaults (``from_dict`` with engine
    ``tensorrt_llm``); top_k=0 and top_p=0 mean greedy to the runtime. ``min_tokens`` is
    ``min_new_tokens`` when given, else ``min_length``. ``end_id``/``pad_id`` are set by the
    engine adapter from the tokenizer. ``temperature: 0`` means greedy (``top_k=1``, ``top_p=0``,
    no temperature), as for every other engine. Several samples: ``n`` is every sample to decode
    (``best_of`` left at its default, ``n``; the scheduler keeps the best) with ``logprobs`` ≥ 1. Beam
    search (``num_beams`` > 1): ``use_beam_search``, ``best_of`` = the width, ``n`` = the beams returned,
    ``length_penalty`` and ``early_stopping`` as the runtime's int (``_TRT_EARLY_STOPPING``).
    """
    kwargs: dict[str, Any] = {
        "max_tokens": p.max_new_tokens,
        "temperature": p.temperature,
        "top_k": max(p.top_k, 0),
        "top_p": p.top_p,
        "seed": p.seed,
        "repetition_penalty": p.repetition_penalty,
        "min_tokens": p.min_new_tokens if p.min_new_tokens > 0 else p.min_length,
        "stop": list(p.stop_sequences) or None,
        "bad": list(p.bad_sequences) or None,
        "stop_token_ids": list(p.stop_token_ids) or None,
        "ignore_eos": p.ignore_eos_token,
        "include_stop_str_in_output": p.include_stop_str_in_output,
        "skip_special_tokens": p.skip_special_tokens,
        "spaces_between_special_tokens": p.spaces_between_special_tokens,
    }
    if p.temperature == 0.0:  # greedy by the one rule (is_sampling): TensorRT-LLM's greedy is top_k=1
        del kwargs["temperature"]
        kwargs.update(top_k=1, top_p=0.0)
    if p.min_p > 0.0:
        kwargs["min_p"] = p.min_p
    if p.logprobs is not None:
        kwargs["logprobs"] = p.logprobs
    if sample_count(p) > 1:  # every sample is a sequence; its log-probs rank them (params/samples.py)
        kwargs["n"] = sample_count(p)
        kwargs["logprobs"] = max(kwargs.get("logprobs") or 0, 1)
    if p.prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = p.prompt_logprobs
    if p.num_beams > 1:  # the LLM API's beam search: best_of is the beam width, n the beams returned
        kwargs.update(use_beam_search=True, best_of=p.num_beams, n=sample_count(p),
                      length_penalty=p.length_penalty, early_stopping=_TRT_EARLY_STOPPING[p.early_stopping])
    for name in _TRT_OPTIONAL:
        if name in p.provided:
            kwargs[name] = getattr(p, name)
    if p.structured_output is not None:
        kwargs["guided_decoding"] = trtllm_structured(p)
    return kwargs


TRANSLATORS = {
    "huggingface": to_hf,
    "deepspeed": to_deepspeed,
    "tensorrt_llm": to_trtllm,
    "vllm": to_vllm,
    "lmi-dist": to_vllm,
}


def translate(p: GenerationParameters, engine: str | None = None) -> dict[str, Any]:
    """Dispatch to the ``to_*`` function of ``engine`` (default: the engine ``p`` was built for)."""
    return TRANSLATORS[normalize_engine(engine or p.engine)](p)
