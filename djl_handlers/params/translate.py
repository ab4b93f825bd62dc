"""Pure per-engine translations of ``GenerationParameters`` and the support table.

``SUPPORT[engine][parameter]`` is one of:

* ``"native"`` — passed to the engine library by that engine's ``to_*`` function;
* ``"emulated"`` — implemented by djl_handlers itself (scheduler, detokenizer, formatter,
  prompt truncation) for that engine, read straight from the parameters object;
* ``"unsupported"`` — rejected when strict (see ``docs/parameters.md``), unless the value equals
  the default (it then asks for nothing).

Every ``to_*`` function returns a plain dict of keyword arguments; nothing here imports an
engine library. Field names of the engine APIs live in the ``to_*`` bodies only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from djl_handlers.params.generation import GenerationParameters

ENGINES: tuple[str, ...] = ("huggingface", "deepspeed", "tensorrt_llm", "vllm", "lmi-dist")

NATIVE = "native"
EMULATED = "emulated"
UNSUPPORTED = "unsupported"

# parameter -> status letters for ENGINES in order (N native, E emulated, U unsupported).
_TABLE: Mapping[str, str] = {
    "do_sample": "NNEEE",
    "seed": "NNNNN",
    "temperature": "NNNNN",
    "repetition_penalty": "NNNNN",
    "top_k": "NNNNN",
    "top_p": "NNNNN",
    "max_new_tokens": "NNNNN",
    "details": "EEEEE",
    "return_full_text": "EEEEE",
    "stop_sequences": "EENNN",
    "typical_p": "NNUUU",
    "truncate": "EEEEE",
    "ignore_eos_token": "EENNN",
    "min_p": "UUNNN",
    "presence_penalty": "UUNNN",
    "frequency_penalty": "UUNNN",
    "num_beams": "UUUUU",
    "length_penalty": "UUNUU",
    "early_stopping": "UUUUU",
    "stop_token_ids": "UUNNN",
    "include_stop_str_in_output": "UUNNN",
    "logprobs": "UUNNN",
    "prompt_logprobs": "UUNNN",
    "skip_special_tokens": "EENNN",
    "spaces_between_special_tokens": "UUNNN",
    "min_length": "UUNUU",
    "bad_sequences": "UUNNN",
    "decoder_input_details": "NNUUU",  # the vLLM adapter does not report prompt/top log-probs yet
    "top_n_tokens": "NNUUU",
    "best_of": "UUUUU",
    "n": "UUUUU",
    "min_new_tokens": "NNNNN",
}
_STATUS = {"N": NATIVE, "E": EMULATED, "U": UNSUPPORTED}

SUPPORT: dict[str, dict[str, str]] = {
    engine: {name: _STATUS[row[i]] for name, row in _TABLE.items()}
    for i, engine in enumerate(ENGINES)
}

_ENGINE_ALIASES: Mapping[str, str] = {
    "trtllm": "tensorrt_llm", "tensorrt-llm": "tensorrt_llm", "lmi_dist": "lmi-dist",
    "hf": "huggingface",
}


def normalize_engine(engine: str) -> str:
    """Canonical engine name; ``ValueError`` for an engine that does not exist (a bug, not input)."""
    name = _ENGINE_ALIASES.get(engine, engine)
    if name not in SUPPORT:
        raise ValueError(f"unknown engine {engine!r}; expected one of {list(ENGINES)}")
    return name


def supported_parameters(engine: str) -> frozenset[str]:
    """Parameters the engine honours (natively or emulated)."""
    row = SUPPORT[normalize_engine(engine)]
    return frozenset(name for name, status in row.items() if status != UNSUPPORTED)


def known_parameters() -> frozenset[str]:
    """Every parameter name in the table (known to at least one engine)."""
    return frozenset(_TABLE)


def _sampling(p: GenerationParameters) -> bool:
    """HF semantics: sampling requested and temperature > 0 (0 means greedy)."""
    return p.do_sample and p.temperature > 0


def to_hf(p: GenerationParameters) -> dict[str, Any]:
    """Keyword arguments for transformers ``model.generate``.

    ``top_k`` is always sent when sampling (transformers' own default is 50, ours is 0 = off);
    ``-1`` becomes 0. Sampling knobs are omitted for greedy decoding (transformers warns about
    them). Seed, stop sequences, eos handling and truncation are applied by djl_handlers.
    """
    kwargs: dict[str, Any] = {
        "max_new_tokens": p.max_new_tokens,
        "do_sample": _sampling(p),
        "repetition_penalty": p.repetition_penalty,
        "num_beams": 1,
    }
    if p.min_new_tokens > 0:
        kwargs["min_new_tokens"] = p.min_new_tokens
    if kwargs["do_sample"]:
        kwargs["temperature"] = p.temperature
        kwargs["top_k"] = max(p.top_k, 0)
        kwargs["top_p"] = p.top_p
        if p.typical_p < 1.0:
            kwargs["typical_p"] = p.typical_p
    return kwargs


def to_deepspeed(p: GenerationParameters) -> dict[str, Any]:
    """Keyword arguments for the DeepSpeed inference engine's ``generate``.

    DeepSpeed's ``init_inference`` wraps the transformers model, so its ``generate`` takes the
    same keywords as ``to_hf``; the support table is identical.
    """
    return to_hf(p)


def _vllm_logprobs(p: GenerationParameters) -> int:
    """Top log-probs per token: explicit ``logprobs``, else ``top_n_tokens``, else 1 (so every
    token carries its own log-prob, as the LMI token object needs)."""
    if p.logprobs is not None:
        return p.logprobs
    return p.top_n_tokens if p.top_n_tokens > 0 else 1


def to_vllm(p: GenerationParameters) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` (vLLM 0.10+ field names).

    Greedy (``do_sample`` false) is ``temperature=0``; ``top_k <= 0`` becomes ``-1`` (accepted
    by every vLLM release as "off"). ``decoder_input_details`` asks for ``prompt_logprobs=1``.
    ``structured_outputs`` (structured output) is a dict of ``StructuredOutputsParams`` keywords
    that the adapter wraps in the installed vLLM's class.
    """
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": p.max_new_tokens,
        "min_tokens": p.min_new_tokens,
        "temperature": p.temperature if p.do_sample else 0.0,
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
        prompt_logprobs = 1
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


def to_trtllm(p: GenerationParameters) -> dict[str, Any]:
    """Keyword arguments for ``tensorrt_llm.SamplingParams`` (LLM API).

    ``guided_decoding`` (structured output) is a dict of ``GuidedDecodingParams`` keywords that
    the adapter wraps. Temperature/top_k/top_p already carry TensorRT-LLM's own defaults (``from_dict`` with engine
    ``tensorrt_llm``); top_k=0 and top_p=0 mean greedy to the runtime. ``min_tokens`` is
    ``min_new_tokens`` when given, else ``min_length``. ``end_id``/``pad_id`` are set by the
    engine adapter from the tokenizer.
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
    if p.min_p > 0.0:
        kwargs["min_p"] = p.min_p
    if p.logprobs is not None:
        kwargs["logprobs"] = p.logprobs
    if p.prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = p.prompt_logprobs
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
