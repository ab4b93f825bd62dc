"""Helpers the adapters of optional engine libraries share (vLLM, TensorRT-LLM, DeepSpeed):
importing the library with a clear install hint, fitting keyword arguments to the installed
release, reading log-probs, and the model / tensor-parallel settings. Imports no engine library.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any, Optional

from djl_handlers.errors import InvalidParameter


def import_engine_library(module: str, engine: str) -> Any:
    """Import ``module`` or raise ``EngineNotInstalled`` naming the pip extra (no traceback chain)."""
    import importlib

    from djl_handlers.engines.registry import not_installed, translate_import_error

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        err = translate_import_error(engine, exc) or not_installed(engine, module)
        raise err from None


def accepted_fields(cls: type) -> frozenset[str]:
    """Keyword names the constructor of ``cls`` accepts (msgspec Struct, dataclass or plain class)."""
    names = getattr(cls, "__struct_fields__", None)
    if names is None and dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls) if f.init]
    if names is None:
        params = inspect.signature(cls).parameters.values()
        names = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return frozenset(n for n in names if not n.startswith("_"))


def fit_kwargs(cls: type, kwargs: Mapping[str, Any], engine: str) -> dict[str, Any]:
    """``kwargs`` restricted to what the installed ``cls`` accepts.

    A key the installed library does not know is dropped when its value asks for nothing
    (None, 0, False, empty); otherwise the request is rejected with ``InvalidParameter``, so an
    option the user set is never silently ignored.
    """
    known = accepted_fields(cls)
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in known:
            out[key] = value
        elif value not in (None, 0, False, "", [], ()):
            version = getattr(inspect.getmodule(cls), "__version__", "") or ""
            raise InvalidParameter(
                f"{key}={value!r} is not supported by the installed {engine} {version}".rstrip(), field=key
            )
    return out


def vllm_structured_kwargs(vllm: Any, structured: Mapping[str, Any]) -> dict[str, Any]:
    """``SamplingParams`` keywords for a structured-output constraint in the installed vLLM:
    ``structured_outputs=StructuredOutputsParams(...)`` (0.11+) or
    ``guided_decoding=GuidedDecodingParams(...)`` (0.6-0.10); neither: ``InvalidParameter``."""
    module = getattr(vllm, "sampling_params", None)
    fields = accepted_fields(vllm.SamplingParams)
    choices = (("structured_outputs", "StructuredOutputsParams"), ("guided_decoding", "GuidedDecodingParams"))
    for keyword, cls_name in choices:
        cls = getattr(module, cls_name, None) or getattr(vllm, cls_name, None)
        if keyword in fields and cls is not None:
            return {keyword: cls(**structured)}
    version = getattr(vllm, "__version__", "")
    raise InvalidParameter(f"structured output is not supported by the installed vLLM {version}".rstrip(),
                           field="parameters")


def token_logprob(entry: Any, token_id: int) -> Optional[float]:
    """The log-prob of ``token_id`` in one position's logprobs entry (a dict of id → Logprob, or
    a float in older TensorRT-LLM releases)."""
    if entry is None:
        return None
    if isinstance(entry, (int, float)):
        return float(entry)
    value = entry.get(token_id) if hasattr(entry, "get") else None
    if value is None:
        return None
    return float(getattr(value, "logprob", value))


def resolve_model(config: Any) -> str:
    """Model id or folder from the config; empty means the embedded default model."""
    from djl_handlers.engines.hf.loader import resolve_model_id

    return resolve_model_id(getattr(config, "model_id", None) or getattr(config, "model_dir", None) or "")


def tensor_parallel_size(config: Any) -> int:
    """``tensor_parallel_degree`` with -1 ("all devices") resolved to the CUDA device count."""
    degree = int(getattr(config, "tensor_parallel_degree", 1) or 1)
    if degree != -1:
        return degree
    import torch

    return max(1, torch.cuda.device_count())
