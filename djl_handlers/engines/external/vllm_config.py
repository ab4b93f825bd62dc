"""vLLM engine settings from a ``ServingConfig``: ``EngineArgs``/``AsyncEngineArgs`` keywords, LoRA
keywords (shared with TensorRT-LLM), the engine's tokenizer and end-of-sequence ids, and the
LMI-Dist notice. Imports no engine library.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from djl_handlers.config.engines import DTYPE_NAMES
from djl_handlers.engines.external.common import resolve_model
from djl_handlers.engines.external.vllm_media import media_kwargs
from djl_handlers.engines.external.vllm_parallel import parallel_kwargs
from djl_handlers.engines.external.vllm_parsers import check_vllm_parsers

LOG = logging.getLogger(__name__)

LMI_DIST_NOTICE = "option.rolling_batch=lmi-dist is served by vLLM (lmi_dist is not installed)"


def engine_args_kwargs(config: Any) -> dict[str, Any]:
    """``vllm.EngineArgs`` (and ``AsyncEngineArgs``) keywords from a ServingConfig-like object."""
    dtype = str(getattr(config, "dtype", "auto") or "auto")
    kwargs: dict[str, Any] = {
        "model": resolve_model(config),
        "dtype": DTYPE_NAMES.get(dtype, dtype),
        **parallel_kwargs(config),  # tensor/pipeline/data parallel sizes, executor backend
        "max_num_seqs": int(getattr(config, "max_rolling_batch_size", 256) or 256),
        "trust_remote_code": bool(getattr(config, "trust_remote_code", False)),
    }
    if getattr(config, "revision", None):
        kwargs["revision"] = config.revision
    opts = getattr(config, "vllm", None)
    max_model_len = getattr(opts, "max_model_len", None) or getattr(config, "max_model_len", None)
    if max_model_len:
        kwargs["max_model_len"] = int(max_model_len)
    if opts is not None:
        kwargs.update(_vllm_option_kwargs(opts))
    kwargs.update(lora_kwargs(config))
    kwargs.update(media_kwargs(config, kwargs["model"]))  # limit_mm_per_prompt for a vision-language model
    check_vllm_parsers(config)  # the reply parsers' names, in vLLM's own registries
    return kwargs


def lora_kwargs(config: Any) -> dict[str, Any]:
    """``enable_lora``/``max_loras``/``max_lora_rank``/``max_cpu_loras`` from ``config.lora`` (vLLM's
    and TensorRT-LLM's names)."""
    lora = getattr(config, "lora", None)
    if lora is None or not lora.enable_lora:
        return {}
    kwargs: dict[str, Any] = {"enable_lora": True, "max_loras": int(lora.max_loras),
                              "max_lora_rank": int(lora.max_lora_rank)}
    if lora.max_cpu_loras:
        kwargs["max_cpu_loras"] = int(lora.max_cpu_loras)
    return kwargs


def _vllm_option_kwargs(opts: Any) -> dict[str, Any]:
    """The ``config.vllm`` option group (``VllmOptions``) in vLLM's names."""
    kwargs: dict[str, Any] = {
        "enforce_eager": bool(opts.enforce_eager),
        "gpu_memory_utilization": float(opts.gpu_memory_utilization),
        "load_format": opts.load_format or "auto",
    }
    if opts.max_rolling_batch_prefill_tokens:
        kwargs["max_num_batched_tokens"] = int(opts.max_rolling_batch_prefill_tokens)
    if opts.quantize:
        kwargs["quantization"] = opts.quantize
    if getattr(opts, "kv_cache_dtype", "auto") != "auto":  # vLLM's own values (fp8 kinds included)
        kwargs["kv_cache_dtype"] = opts.kv_cache_dtype
    if getattr(opts, "speculative_config", None):  # option.speculative_config: vLLM's own JSON object
        kwargs["speculative_config"] = dict(opts.speculative_config)
    if opts.enable_lora:  # config.lora (lora_kwargs) is the same options; kept for option groups built alone
        kwargs.update(enable_lora=True, max_loras=int(opts.max_loras), max_lora_rank=int(opts.max_lora_rank))
    return kwargs


def engine_tokenizer(engine: Any) -> Any:
    """The Hugging Face tokenizer inside a vLLM engine (V1 ``get_tokenizer()``; V0 tokenizer group)."""
    getter = getattr(engine, "get_tokenizer", None)
    tokenizer = getter() if callable(getter) else None
    if tokenizer is None and callable(getattr(engine, "get_tokenizer_group", None)):
        tokenizer = engine.get_tokenizer_group()
    return getattr(tokenizer, "tokenizer", tokenizer)


def eos_ids(tokenizer: Any) -> frozenset[int]:
    """The tokenizer's end-of-sequence id(s)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos]) if isinstance(eos, int) else frozenset(int(i) for i in eos)


def is_lmi_dist(engine_name: str, config: Any) -> bool:
    """``option.rolling_batch=lmi-dist`` (served by vLLM); logs which engine serves it."""
    if engine_name != "lmi-dist" and getattr(config, "params_engine", None) != "lmi-dist":
        return False
    if importlib.util.find_spec("lmi_dist") is None:
        LOG.warning(LMI_DIST_NOTICE)
    else:
        LOG.warning("option.rolling_batch=lmi-dist is served by vLLM (lmi_dist is installed but not used)")
    return True


def require_loras(adapter: Any) -> Any:
    """The adapter's registered LoRA adapters (``lora.external.EngineLoras``), or the error saying
    LoRA is off."""
    if adapter.loras is None:
        from djl_handlers.lora.registry import AdapterError

        raise AdapterError("LoRA adapters are not enabled for this model; set option.enable_lora=true",
                           field="option.enable_lora")
    return adapter.loras
