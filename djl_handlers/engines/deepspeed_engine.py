"""DeepSpeed adapter: the HF engine's continuous batching over a model wrapped by DeepSpeed.

The model and tokenizer are loaded by the HF loader (same options as ``djl_handlers.huggingface``),
then ``deepspeed.init_inference(model, dtype=..., replace_with_kernel_inject=False,
tensor_parallel={"tp_size": N})`` wraps it and the wrapped ``.module`` (the same transformers
model, its linear layers sharded by AutoTP when N > 1) is stepped by :class:`HFEngine`. Kernel
injection stays off: it fails on CPU ("This op had not been implemented on CPU backend") and
AutoTP covers every model transformers supports.

Tensor parallelism (N > 1) needs N processes started by ``mpirun``/the DeepSpeed launcher
(``RANK``/``WORLD_SIZE``/``MASTER_ADDR``). The adapter calls ``deepspeed.init_distributed``
(gloo on CPU, nccl on GPU) when no process group exists, checks that the world size equals N, and
on CPU sets ``deepspeed.comm.comm.cdb.shm_vector_kernel_level = 0``: DeepSpeed's JIT-built
shared-memory all-reduce segfaults on CPU (measured with 0.19.8), the gloo all-reduce works.

This module imports torch (through ``hf_engine``); the registry imports it only after checking
that deepspeed, torch and transformers are installed.
"""

from __future__ import annotations

import logging
from typing import Any

from djl_handlers.engines.hf_engine import HFEngine
from djl_handlers.engines.vllm_engine import import_engine_library, tensor_parallel_size
from djl_handlers.errors import ConfigError

LOG = logging.getLogger(__name__)

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _torch_dtype(dtype: str, model: Any) -> Any:
    """``torch.dtype`` for the config's dtype; ``auto`` keeps the model's own."""
    import torch

    name = TORCH_DTYPES.get(dtype)
    if name is None:
        return next(model.parameters()).dtype
    return getattr(torch, name)


def init_distributed(ds: Any, tp_size: int, on_cpu: bool) -> None:
    """Join (or create) the process group for ``tp_size``-way tensor parallelism."""
    comm = ds.comm
    if not comm.is_initialized():
        ds.init_distributed(dist_backend="gloo" if on_cpu else "nccl")
    world = int(comm.get_world_size())
    if world != tp_size:
        raise ConfigError(
            f"tensor_parallel_degree={tp_size} needs {tp_size} processes (start them with mpirun or the "
            f"deepspeed launcher); this process group has {world}",
            field="option.tensor_parallel_degree",
        )
    if on_cpu:
        # DeepSpeed's shared-memory all-reduce kernel segfaults on CPU; fall back to gloo's.
        comm.comm.cdb.shm_vector_kernel_level = 0


def _inference_kwargs(config: Any, model: Any, tp_size: int, on_cpu: bool) -> dict[str, Any]:
    """``deepspeed.init_inference`` keywords from the config (``config.deepspeed`` options)."""
    kwargs: dict[str, Any] = {
        "dtype": _torch_dtype(str(getattr(config, "dtype", "auto") or "auto"), model),
        "replace_with_kernel_inject": False,
        "tensor_parallel": {"tp_size": tp_size},
    }
    opts = getattr(config, "deepspeed", None)
    if opts is None:
        return kwargs
    if opts.quantize:
        raise ConfigError(
            f"option.quantize={opts.quantize} needs DeepSpeed kernel injection, which djl_handlers does not use",
            field="option.quantize",
        )
    kwargs.update(max_tokens=opts.max_tokens, return_tuple=opts.return_tuple)
    if opts.enable_cuda_graph and not on_cpu:
        kwargs["enable_cuda_graph"] = True
    if opts.checkpoint:
        kwargs["checkpoint"] = opts.checkpoint
    return kwargs


def init_deepspeed(model: Any, config: Any, ds: Any = None) -> Any:
    """Wrap ``model`` with ``deepspeed.init_inference`` and return the wrapped module."""
    import torch

    ds = ds if ds is not None else import_engine_library("deepspeed", "deepspeed")
    tp_size = tensor_parallel_size(config)
    on_cpu = not torch.cuda.is_available()
    if tp_size > 1:
        init_distributed(ds, tp_size, on_cpu)
    kwargs = _inference_kwargs(config, model, tp_size, on_cpu)
    LOG.info("deepspeed.init_inference(%s)", kwargs)
    engine = ds.init_inference(model, **kwargs)
    module = engine.module
    module.eval()
    return module


class DeepSpeedEngine(HFEngine):
    """:class:`HFEngine` over a DeepSpeed-wrapped model (see the module docstring)."""

    name = "deepspeed"

    @classmethod
    def load(cls, config: Any = None, **kwargs: Any) -> DeepSpeedEngine:
        """Load with the HF loader, wrap with DeepSpeed, then build the HF stepping around it.

        ``HFEngine.from_config`` reads the options and calls this; the model is loaded on the CPU
        when tensor parallelism is on (DeepSpeed shards it and moves the shards to each rank's
        device).
        """
        from djl_handlers.engines.hf_loader import LoadOptions, load_model_and_tokenizer

        ds = import_engine_library("deepspeed", "deepspeed")
        engine_keys = ("max_batch_size", "max_prefill_tokens", "max_model_len")
        engine_kwargs = {k: kwargs.pop(k) for k in engine_keys if kwargs.get(k) is not None}
        for key in engine_keys:
            kwargs.pop(key, None)
        if tensor_parallel_size(config) > 1:
            kwargs["device"] = "cpu"
        model, tokenizer = load_model_and_tokenizer(LoadOptions.from_config(config, **kwargs))
        module = init_deepspeed(model, config, ds)
        return cls(module, tokenizer, **engine_kwargs)
