"""DeepSpeed adapter: the HF engine's continuous batching over a model wrapped by DeepSpeed.

The model and tokenizer are loaded by the HF loader (same options as ``djl_handlers.huggingface``),
then ``deepspeed.init_inference(model, dtype=..., replace_with_kernel_inject=False,
tensor_parallel={"tp_size": N}, ...)`` wraps it and the wrapped ``.module`` (the same transformers
model, its linear layers sharded by AutoTP when N > 1) is stepped by :class:`HFEngine`. Kernel
injection stays off: it fails on CPU ("This op had not been implemented on CPU backend") and
AutoTP covers every model transformers supports. With N = 1 and no kernel injection DeepSpeed only
casts the model to ``dtype`` and moves it to its accelerator's device.

Because the HF engine calls ``.module`` directly (one forward per step, shapes changing every
step), ``InferenceEngine.forward``'s CUDA-graph replay is never used: ``option.enable_cuda_graph``
is ignored with a warning.

Tensor parallelism (N > 1) needs N processes started by ``mpirun``/the DeepSpeed launcher
(``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``), each fed the same requests. The adapter
calls ``deepspeed.init_distributed`` (gloo on CPU, nccl on GPU) when no process group exists and
checks that the world size equals N. On CPU it first marks DeepSpeed's shared-memory all-reduce op
(``deepspeed_shm_comm``) incompatible, so the op is neither JIT-compiled (minutes, needs a C++
compiler at run time) nor used: with DeepSpeed 0.19.8 its ``inference_all_reduce`` segfaults (exit
139 on both ranks, measured here on an AVX-512 CPU); gloo's all-reduce works. If a process group
with the op already exists, ``shm_vector_kernel_level = 0`` makes DeepSpeed fall back to gloo.

This module imports torch (through the HF engine); the registry imports it only after checking
that deepspeed, torch and transformers are installed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from djl_handlers.config.engines import DTYPE_NAMES
from djl_handlers.engines.external.common import import_engine_library, tensor_parallel_size
from djl_handlers.engines.hf.engine import HFEngine, step_limits
from djl_handlers.engines.hf.kv_dtype import resolve_kv_dtype
from djl_handlers.errors import ConfigError

if TYPE_CHECKING:
    from djl_handlers.config.models import ServingConfig

LOG = logging.getLogger(__name__)

SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's CPU shared-memory all-reduce (ShareMemCommBuilder.NAME)


def _torch_dtype(dtype: str, model: Any) -> Any:
    """``torch.dtype`` for the config's dtype; ``auto`` keeps the model's own."""
    import torch

    name = DTYPE_NAMES.get(dtype)
    if name in (None, "auto"):
        return next(model.parameters()).dtype
    return getattr(torch, name)


def disable_shm_all_reduce(ds: Any) -> bool:
    """Mark DeepSpeed's shared-memory all-reduce op incompatible before the process group exists.

    ``deepspeed.comm``'s torch backend then skips building (JIT) and initialising it, and
    ``inference_all_reduce`` uses the process group's (gloo) all-reduce. DeepSpeed documents
    ``deepspeed.ops.__compatible_ops__`` as one cached dict whose edits persist. Returns False
    when this DeepSpeed has no such dict (the level-0 fallback in :func:`init_distributed` still
    applies).
    """
    try:
        ops = ds.ops.__compatible_ops__
    except AttributeError:
        return False
    if not isinstance(ops, dict):
        return False
    ops[SHM_OP] = False
    return True


def init_distributed(ds: Any, tp_size: int, on_cpu: bool) -> None:
    """Join (or create) the process group for ``tp_size``-way tensor parallelism."""
    comm = ds.comm
    if not comm.is_initialized():
        if on_cpu and not disable_shm_all_reduce(ds):
            LOG.debug("deepspeed.ops.__compatible_ops__ not found; the shm all-reduce may be JIT-built")
        ds.init_distributed(dist_backend="gloo" if on_cpu else "nccl")
    world = int(comm.get_world_size())
    if world != tp_size:
        raise ConfigError(
            f"tensor_parallel_degree={tp_size} needs {tp_size} processes (start them with mpirun or the "
            f"deepspeed launcher); this process group has {world}",
            field="option.tensor_parallel_degree",
        )
    if on_cpu:
        # Whatever built the group: DeepSpeed's shm all-reduce segfaults on CPU, gloo's works.
        comm.comm.cdb.shm_vector_kernel_level = 0


def _inference_kwargs(config: Any, model: Any, tp_size: int) -> dict[str, Any]:
    """``deepspeed.init_inference`` keywords from the config (``config.deepspeed`` options).

    Keys are ``DeepSpeedInferenceConfig`` fields of DeepSpeed 0.19 (``max_tokens`` is the alias of
    ``max_out_tokens``); that config forbids unknown keys.
    """
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
            f"option.quantize={opts.quantize} needs DeepSpeed kernel injection, which djl_handlers does not use; "
            "on a CPU, option.entryPoint=djl_handlers.huggingface with option.quantize=dynamic_int8 serves int8",
            field="option.quantize",
        )
    if opts.enable_cuda_graph:
        LOG.warning(
            "option.enable_cuda_graph is ignored: continuous batching changes shapes every step and "
            "steps the wrapped module, not InferenceEngine.forward (where DeepSpeed replays graphs)"
        )
    kwargs.update(
        max_tokens=opts.max_tokens,
        return_tuple=opts.return_tuple,
        triangular_masking=opts.triangular_masking,
        training_mp_size=opts.training_mp_size,
    )
    if opts.checkpoint:
        kwargs["checkpoint"] = opts.checkpoint
    return kwargs


def wrap_model(model: Any, config: Any, ds: Any = None) -> Any:
    """``deepspeed.init_inference`` around ``model``; returns DeepSpeed's ``InferenceEngine``."""
    import torch

    ds = ds if ds is not None else import_engine_library("deepspeed", "deepspeed")
    tp_size = tensor_parallel_size(config)
    on_cpu = not torch.cuda.is_available()
    if tp_size > 1:
        init_distributed(ds, tp_size, on_cpu)
    kwargs = _inference_kwargs(config, model, tp_size)
    LOG.info("deepspeed.init_inference(%s)", kwargs)
    engine = ds.init_inference(model, **kwargs)
    engine.module.eval()
    return engine


def init_deepspeed(model: Any, config: Any, ds: Any = None) -> Any:
    """Wrap ``model`` with ``deepspeed.init_inference`` and return the wrapped module."""
    return wrap_model(model, config, ds).module


def _threads_per_rank(tp_size: int) -> int | None:
    """CPU threads for one of ``tp_size`` ranks on this machine, unless ``OMP_NUM_THREADS`` is set."""
    if tp_size <= 1 or os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return None
    return max(1, (os.cpu_count() or 1) // tp_size)


class DeepSpeedEngine(HFEngine):
    """:class:`HFEngine` over a DeepSpeed-wrapped model (see the module docstring)."""

    name = "deepspeed"
    ds_engine: Any = None  # deepspeed.InferenceEngine; ``self.model`` is its ``.module``

    @classmethod
    def load(cls, config: ServingConfig) -> DeepSpeedEngine:
        """Load with the HF loader, wrap with DeepSpeed, then build the HF stepping around it.

        ``HFEngine.from_config`` calls this. With tensor parallelism the model is loaded on the
        CPU (DeepSpeed shards it and moves each shard to its rank's device) and, on a CPU-only
        machine without ``torch_threads``/``OMP_NUM_THREADS``, each rank gets
        ``cpu_count // tp_size`` threads so the ranks do not oversubscribe the cores.
        """
        import torch

        from djl_handlers.engines.hf.loader import LoadOptions, load_model_and_tokenizer

        ds = import_engine_library("deepspeed", "deepspeed")
        options = LoadOptions.from_config(config)
        hf = options.hf
        tp_size = tensor_parallel_size(config)
        if tp_size > 1:
            options = replace(options, device="cpu")
            if hf.torch_threads is None and not torch.cuda.is_available():
                hf = replace(hf, torch_threads=_threads_per_rank(tp_size))
        # DeepSpeed replaces or shards the linear layers (AutoTP); a fused q/k/v or gate/up group
        # would keep computing with the unsharded originals, so each projection stays its own layer.
        options = replace(options, hf=replace(hf, cpu_fuse_projections=False))
        model, tokenizer = load_model_and_tokenizer(options)
        wrapped = wrap_model(model, config, ds)
        engine = cls(wrapped.module, tokenizer, **step_limits(config))
        engine.use_kv_dtype(resolve_kv_dtype(config.hf.kv_cache_dtype, engine.model))
        engine.ds_engine = wrapped
        return engine
