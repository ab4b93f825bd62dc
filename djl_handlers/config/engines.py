"""The one table of engine names, their aliases and the dtype option's library names.

Every layer that names an engine (configuration, the parameter support table, the engine
registry) reads it from here, so the lists cannot drift apart. No imports, no work.
"""

from __future__ import annotations

from collections.abc import Mapping

# The handler engines, in the order the parameter support table lists them.
ENGINES: tuple[str, ...] = ("huggingface", "deepspeed", "tensorrt_llm", "vllm", "lmi-dist")

# Other spellings users and DJL write for them. ``scheduler`` is DJL's name for its own
# continuous batching over transformers, i.e. our HF engine.
ALIASES: Mapping[str, str] = {
    "hf": "huggingface",
    "scheduler": "huggingface",
    "lmi_dist": "lmi-dist",
    "trtllm": "tensorrt_llm",
    "tensorrt-llm": "tensorrt_llm",
}

# option.dtype value -> the dtype's name in torch / vLLM / TensorRT-LLM (``auto``: the model's own).
DTYPE_NAMES: Mapping[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "auto": "auto"}


def canonical_engine(name: str, known: tuple[str, ...] | frozenset[str] = ENGINES) -> str | None:
    """The canonical name of ``name`` (aliases resolved) when it is in ``known``, else None."""
    key = ALIASES.get(name, name)
    return key if key in known else None
