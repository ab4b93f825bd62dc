"""The parameter support table: which engine honours which generation parameter, and how.

``SUPPORT[engine][parameter]`` is one of:

* ``"native"`` — passed to the engine library by that engine's ``to_*`` translation
  (:mod:`djl_handlers.params.translate`);
* ``"emulated"`` — implemented by djl_handlers itself (scheduler, detokenizer, formatter,
  prompt truncation) for that engine, read straight from the parameters object;
* ``"unsupported"`` — rejected when strict (see ``docs/parameters.md``), unless the value equals
  the default (it then asks for nothing).

This module is a leaf: both ``generation`` (validation) and ``translate`` (the ``to_*``
functions) import it, and neither imports the other at run time.
"""

from __future__ import annotations

from collections.abc import Mapping

from djl_handlers.config.engines import ENGINES, canonical_engine

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
    "min_p": "NNNNN",
    "presence_penalty": "NNNNN",
    "frequency_penalty": "NNNNN",
    "num_beams": "NNNNN",  # HF/DeepSpeed: beams in the batch (engines/hf/beam_rows.py); vLLM, TensorRT-LLM: theirs
    "length_penalty": "NNNNN",
    "early_stopping": "NNNEE",  # vLLM: our loop over its engine with transformers' rule (vllm_beam_loop.py)
    "stop_token_ids": "EENNN",  # HF/DeepSpeed: the scheduler stops on them (scheduling/slot.py)
    "include_stop_str_in_output": "EENNN",
    "logprobs": "NNNNN",
    "prompt_logprobs": "NNNNN",
    "skip_special_tokens": "EENNN",
    "spaces_between_special_tokens": "EENNN",
    "min_length": "NNNNN",
    "bad_sequences": "NNNNN",
    "decoder_input_details": "NNUNN",  # vLLM: its prompt_logprobs / logprobs (vllm_outputs.py)
    "top_n_tokens": "NNUNN",
    "best_of": "NNEEE",  # several samples of a prompt: see params/samples.py; vLLM V1 (and our
    "n": "NNNNN",  # TensorRT-LLM adapter) decode best_of samples as their n; the scheduler keeps the best
    "min_new_tokens": "NNNNN",
}
_STATUS = {"N": NATIVE, "E": EMULATED, "U": UNSUPPORTED}

SUPPORT: dict[str, dict[str, str]] = {
    engine: {name: _STATUS[row[i]] for name, row in _TABLE.items()}
    for i, engine in enumerate(ENGINES)
}



def normalize_engine(engine: str) -> str:
    """Canonical engine name; ``ValueError`` for an engine that does not exist (a bug, not input)."""
    name = canonical_engine(engine)
    if name is None:
        raise ValueError(f"unknown engine {engine!r}; expected one of {list(ENGINES)}")
    return name


def supported_parameters(engine: str) -> frozenset[str]:
    """Parameters the engine honours (natively or emulated)."""
    row = SUPPORT[normalize_engine(engine)]
    return frozenset(name for name, status in row.items() if status != UNSUPPORTED)


def known_parameters() -> frozenset[str]:
    """Every parameter name in the table (known to at least one engine)."""
    return frozenset(_TABLE)
