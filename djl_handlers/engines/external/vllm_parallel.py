"""vLLM's ranks from a ``ServingConfig``: the parallel ``EngineArgs`` keywords, the start-up checks
of the degrees against the model and this machine, and the CPU thread binding of the ranks.

vLLM starts and feeds the ranks itself (``distributed_executor_backend``: ``mp`` on one node,
``ray`` across the nodes of a Ray cluster); nothing here runs a rank. What the handler adds:

- the degrees checked before vLLM loads anything (``config.parallel``): a model the degree cannot
  split, GPUs the machine does not have, Ray on a vLLM platform that has no Ray device (vLLM's CPU
  build: ``current platform cpu does not support ray``), pipeline stages on vLLM's CPU engine (it
  starts them, then its first step fails), data parallelism without async mode;
- on vLLM's CPU engine, a thread binding that works when the ranks outnumber the NUMA nodes. vLLM's
  default (``VLLM_CPU_OMP_THREADS_BIND=auto``) binds rank *i* to NUMA node *i* and refuses to start
  otherwise; the handler then gives each local rank its own slice of the usable cores (ranks share
  cores round-robin when there are fewer cores than ranks), as ``VLLM_CPU_OMP_THREADS_BIND``'s
  per-rank lists (``0|1|0``), only while vLLM starts and only when the user did not set it.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from djl_handlers.config.parallel import (
    Machine,
    ModelShape,
    ParallelOptions,
    check_machine_fit,
    check_model_split,
)
from djl_handlers.engines.external.common import tensor_parallel_size
from djl_handlers.errors import ConfigError

__all__ = ["OMP_BIND_ENV", "cpu_lists", "parallel_kwargs", "probe_machine", "ranks_started"]

LOG = logging.getLogger(__name__)

OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def parallel_options(config: Any) -> ParallelOptions:
    """``config.parallel``, or the tensor degree alone for a config-like object without it."""
    options = getattr(config, "parallel", None)
    if isinstance(options, ParallelOptions):
        return options
    return ParallelOptions(tensor_parallel_degree=int(getattr(config, "tensor_parallel_degree", 1) or 1))


def parallel_kwargs(config: Any) -> dict[str, Any]:
    """``tensor_parallel_size`` always; ``pipeline_parallel_size``, ``data_parallel_size`` and
    ``distributed_executor_backend`` when set (vLLM's defaults otherwise)."""
    options = parallel_options(config)
    kwargs: dict[str, Any] = {"tensor_parallel_size": tensor_parallel_size(config)}
    if options.pipeline_parallel_degree > 1:
        kwargs["pipeline_parallel_size"] = options.pipeline_parallel_degree
    if options.data_parallel_size > 1:
        kwargs["data_parallel_size"] = options.data_parallel_size
    if options.distributed_executor_backend:
        kwargs["distributed_executor_backend"] = options.distributed_executor_backend
    return kwargs


def _ranks(kwargs: dict[str, Any]) -> int:
    return (int(kwargs.get("tensor_parallel_size") or 1) * int(kwargs.get("pipeline_parallel_size") or 1)
            * int(kwargs.get("data_parallel_size") or 1))


def _usable_cpus() -> list[int]:
    getter = getattr(os, "sched_getaffinity", None)
    return sorted(getter(0)) if callable(getter) else list(range(os.cpu_count() or 1))


def _numa_nodes(cpus: list[int]) -> int:
    """NUMA nodes holding at least one of ``cpus`` (Linux sysfs; 1 when it cannot tell)."""
    usable, nodes = set(cpus), 0
    for path in glob.glob("/sys/devices/system/node/node[0-9]*/cpulist"):
        try:
            text = open(path, encoding="ascii").read().strip()
        except OSError:
            continue
        ids: set[int] = set()
        for part in filter(None, text.split(",")):
            low, _, high = part.partition("-")
            ids.update(range(int(low), int(high or low) + 1))
        nodes += bool(ids & usable)
    return max(1, nodes)


def probe_machine(platform: Any) -> Machine:
    """Cores, NUMA nodes and (on a GPU platform) devices vLLM's ``platform`` can use."""
    cpus = _usable_cpus()
    gpus, note = 0, ""
    if not platform.is_cpu():
        gpus = int(platform.device_count())
        visible = os.environ.get(getattr(platform, "device_control_env_var", "") or "CUDA_VISIBLE_DEVICES")
        note = f" ({platform.device_name}; visible: {visible})" if visible is not None else f" ({platform.device_name})"
    return Machine(cpus=len(cpus), numa_nodes=_numa_nodes(cpus), gpus=gpus, gpu_note=note)


def cpu_lists(ranks: int, cpus: list[int]) -> list[list[int]]:
    """One core list per rank: contiguous, near-equal slices of ``cpus``, or one core each, shared
    round-robin, when the ranks outnumber the cores."""
    if not cpus:
        raise ValueError("no usable CPU")
    if ranks > len(cpus):
        return [[cpus[i % len(cpus)]] for i in range(ranks)]
    size, extra = divmod(len(cpus), ranks)
    lists, start = [], 0
    for rank in range(ranks):
        end = start + size + (1 if rank < extra else 0)
        lists.append(cpus[start:end])
        start = end
    return lists


def _platform(vllm: Any) -> Any:
    """``vllm.platforms.current_platform``; None for a vLLM without it."""
    try:
        return importlib.import_module(f"{vllm.__name__}.platforms").current_platform
    except (ImportError, AttributeError):
        return None


def _check(vllm: Any, config: Any, kwargs: dict[str, Any], platform: Any) -> None:
    options = parallel_options(config)
    check_model_split(options, ModelShape.from_folder(str(kwargs.get("model") or "")))
    if options.distributed_executor_backend == "ray" and platform is not None:
        if importlib.util.find_spec("ray") is None:
            raise ConfigError("option.distributed_executor_backend=ray needs Ray: pip install ray",
                              field="option.distributed_executor_backend")
        if not getattr(platform, "ray_device_key", "GPU"):
            raise ConfigError(
                f"option.distributed_executor_backend=ray: vLLM {getattr(vllm, '__version__', '')} on "
                f"{platform.device_name} cannot run over Ray (its platform declares no Ray device: 'current "
                f"platform {platform.device_name} does not support ray'); use mp, which runs the ranks on "
                "this node", field="option.distributed_executor_backend")
    if options.pipeline_parallel_degree > 1 and platform is not None and platform.is_cpu():
        raise ConfigError(
            f"option.pipeline_parallel_degree={options.pipeline_parallel_degree}: vLLM "
            f"{getattr(vllm, '__version__', '')}'s CPU engine starts the pipeline stages but fails on the first "
            "step (its model runner has no intermediate tensors for a later stage: AssertionError in "
            "sync_and_gather_intermediate_tensors); pipeline parallelism needs vLLM on GPUs. On the CPU use "
            "option.tensor_parallel_degree", field="option.pipeline_parallel_degree")
    if options.data_parallel_size > 1 and not getattr(config, "async_mode", False):
        raise ConfigError(
            f"option.data_parallel_size={options.data_parallel_size} needs async mode (option.async_mode=true: "
            "vLLM's AsyncLLM balances requests over its data-parallel engines), or run replicas",
            field="option.data_parallel_size")
    if platform is not None:
        for warning in check_machine_fit(options, probe_machine(platform)):
            LOG.warning(warning)


@contextmanager
def ranks_started(vllm: Any, config: Any, kwargs: dict[str, Any]) -> Iterator[None]:
    """Check the degrees, then let vLLM start its ranks inside this block with a CPU thread binding
    that works (see the module docstring); the environment is restored afterwards."""
    platform = _platform(vllm)
    _check(vllm, config, kwargs, platform)
    ranks = _ranks(kwargs)
    cpus = _usable_cpus()
    if (platform is None or not platform.is_cpu() or ranks <= _numa_nodes(cpus) or os.environ.get(OMP_BIND_ENV)
            or kwargs.get("distributed_executor_backend") == "ray"):
        yield
        return
    value = "|".join(",".join(str(c) for c in cores) for cores in cpu_lists(ranks, cpus))
    LOG.info("%d vLLM CPU ranks on %d NUMA node(s): %s=%s", ranks, _numa_nodes(cpus), OMP_BIND_ENV, value)
    os.environ[OMP_BIND_ENV] = value
    try:
        yield
    finally:
        os.environ.pop(OMP_BIND_ENV, None)
