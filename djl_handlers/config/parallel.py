"""Parallel options (tensor / pipeline / data parallel degrees, vLLM's executor backend) typed and
validated, and the checks of those degrees against the model's shape and against the machine.

Distribution is the engine's job, as in LMI: ``option.tensor_parallel_degree`` and
``option.pipeline_parallel_degree`` become vLLM's ``tensor_parallel_size`` /
``pipeline_parallel_size``, ``option.distributed_executor_backend`` (``mp`` on one node, ``ray``
across nodes) chooses vLLM's executor, ``option.data_parallel_size`` its data-parallel engines.
``max`` (DJL's word) means every device: 1 on the CPU, -1 ("all GPUs", counted by the engine) else.
DJL's front end fills the two degrees from ``TENSOR_PARALLEL_DEGREE`` / ``PIPELINE_PARALLEL_DEGREE``
(``config.resolve``); this module reads the resulting options.

The model check reads the head counts from ``config.json`` (no ML library): vLLM shards attention
heads, KV heads (replicated when the degree exceeds them) and the MLP width by the tensor-parallel
degree, and layers by the pipeline degree. The machine check takes a :class:`Machine` the engine
adapter probed (cores, NUMA nodes, GPUs). Every refusal is a ``ConfigError`` naming the option.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from djl_handlers.config.reader import Reader
from djl_handlers.errors import ConfigError

__all__ = ["EXECUTOR_BACKENDS", "Machine", "ModelShape", "ParallelOptions", "check_machine_fit",
           "check_model_split", "read_parallel", "tensor_degrees_that_split"]

EXECUTOR_BACKENDS: tuple[str, ...] = ("mp", "ray")
# Engines that split a model over ranks themselves: vLLM (and lmi-dist, served by it), TensorRT-LLM,
# DeepSpeed (its own ranks, started by its launcher).
_TENSOR_PARALLEL_ENGINES: tuple[str, ...] = ("vllm", "lmi-dist", "tensorrt_llm", "deepspeed")
_PIPELINE_PARALLEL_ENGINES: tuple[str, ...] = ("vllm", "lmi-dist", "tensorrt_llm")
_TP = "option.tensor_parallel_degree"
_PP = "option.pipeline_parallel_degree"


@dataclass(frozen=True)
class ParallelOptions:
    """How many ranks and which executor (see the module docstring)."""

    tensor_parallel_degree: int = 1  # -1: every GPU of the machine ("max" off the CPU)
    pipeline_parallel_degree: int = 1
    distributed_executor_backend: str | None = None  # mp | ray; None: the engine's default
    data_parallel_size: int = 1

    def world_size(self, gpus: int = 1) -> int:
        """Ranks in all: TP x PP x DP, with -1 counted as ``gpus``."""
        tp = gpus if self.tensor_parallel_degree == -1 else self.tensor_parallel_degree
        return max(1, tp) * self.pipeline_parallel_degree * self.data_parallel_size


def _tensor_degree(r: Reader, device: str) -> int:
    """``max`` → 1 on CPU, -1 ("all devices") elsewhere; otherwise an int >= 1 or -1."""
    found = r.get("tensor_parallel_degree")
    if found is None:
        return 1
    label, value = found
    if value.lower() == "max":
        return 1 if device == "cpu" else -1
    if re.fullmatch(r"-1|\d{1,4}", value) and int(value) != 0:
        return int(value)
    raise r.fail(label, value, "an integer >= 1, -1 (all devices) or 'max'")


def read_parallel(r: Reader, device: str, engine: str) -> ParallelOptions:
    """The parallel options for the handler's ``engine``; a degree the engine cannot split by is a
    ``ConfigError`` here (the HF engine runs one process on one device)."""
    options = ParallelOptions(
        tensor_parallel_degree=_tensor_degree(r, device),
        pipeline_parallel_degree=r.integer("pipeline_parallel_degree", 1, 1) or 1,
        distributed_executor_backend=r.choice("distributed_executor_backend", "", ("", *EXECUTOR_BACKENDS)) or None,
        data_parallel_size=r.integer("data_parallel_size", 1, 1) or 1,
    )
    rolling = (r.text("rolling_batch") or "").lower()
    serving = "vllm" if rolling in ("vllm", "lmi-dist") and engine == "huggingface" else engine
    if options.tensor_parallel_degree > 1 and serving not in _TENSOR_PARALLEL_ENGINES:
        raise ConfigError(
            f"{_TP}={options.tensor_parallel_degree}: the {engine} engine runs the whole model in one process "
            "on one device and cannot split it; tensor parallelism is vLLM's (djl_handlers.vllm, or "
            "option.rolling_batch=vllm) or DeepSpeed's (djl_handlers.deepspeed). Set it to 1 (or max)", field=_TP)
    if options.pipeline_parallel_degree > 1 and serving not in _PIPELINE_PARALLEL_ENGINES:
        raise ConfigError(f"{_PP}={options.pipeline_parallel_degree}: the {engine} engine has no pipeline "
                          "parallelism; vLLM (djl_handlers.vllm) has it. Set it to 1", field=_PP)
    return options


# -- the model: can it be split by these degrees? ------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """What a tensor/pipeline split depends on, from a Hugging Face ``config.json``."""

    attention_heads: int
    kv_heads: int
    layers: int
    intermediate_size: int | None = None

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> ModelShape | None:
        """From a parsed ``config.json`` (its ``text_config`` for a multimodal model); None when the
        head counts are not there."""
        text = data.get("text_config")
        source = text if isinstance(text, Mapping) and "num_attention_heads" in text else data
        heads, layers = source.get("num_attention_heads"), source.get("num_hidden_layers")
        if not isinstance(heads, int) or not isinstance(layers, int) or heads < 1 or layers < 1:
            return None
        kv = source.get("num_key_value_heads")
        width = source.get("intermediate_size")
        return cls(heads, kv if isinstance(kv, int) and kv > 0 else heads, layers,
                   width if isinstance(width, int) and width > 0 else None)

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelShape | None:
        """From ``folder/config.json``; None when it is missing or unreadable (the engine checks)."""
        try:
            data = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return cls.from_config(data) if isinstance(data, Mapping) else None

    def splits_by(self, tp: int) -> bool:
        """vLLM's rule: heads divide by ``tp``; KV heads divide by it, or it by them (replicated KV
        heads); the MLP width divides by it."""
        kv_ok = self.kv_heads % tp == 0 if tp <= self.kv_heads else tp % self.kv_heads == 0
        width_ok = self.intermediate_size is None or self.intermediate_size % tp == 0
        return self.attention_heads % tp == 0 and kv_ok and width_ok


def tensor_degrees_that_split(shape: ModelShape) -> list[int]:
    """Every tensor-parallel degree the model can be split by (1 included)."""
    return [tp for tp in range(1, shape.attention_heads + 1) if shape.splits_by(tp)]


def check_model_split(options: ParallelOptions, shape: ModelShape | None) -> None:
    """``ConfigError`` when ``shape`` cannot be split by the degrees (naming the counts and the
    degrees that work); nothing when the shape is unknown."""
    if shape is None:
        return
    tp = options.tensor_parallel_degree
    if tp > 1 and not shape.splits_by(tp):
        width = f", MLP width {shape.intermediate_size}" if shape.intermediate_size else ""
        works = ", ".join(str(d) for d in tensor_degrees_that_split(shape))
        raise ConfigError(
            f"{_TP}={tp} cannot split this model: it has {shape.attention_heads} attention heads and "
            f"{shape.kv_heads} KV heads{width} (config.json), which the degree must divide (KV heads may "
            f"instead divide the degree); degrees that work: {works}", field=_TP)
    pp = options.pipeline_parallel_degree
    if pp > shape.layers:
        raise ConfigError(f"{_PP}={pp} cannot split this model: it has {shape.layers} hidden layers "
                          f"(config.json); degrees that work: 1 to {shape.layers}", field=_PP)


# -- the machine: can it hold these ranks? -------------------------------------------------------
@dataclass(frozen=True)
class Machine:
    """What the engine adapter found: usable CPU cores, NUMA nodes among them, GPUs (0 on a CPU engine)."""

    cpus: int
    numa_nodes: int
    gpus: int = 0
    gpu_note: str = ""  # how the GPUs were counted, for the error message


def check_machine_fit(options: ParallelOptions, machine: Machine) -> list[str]:
    """``ConfigError`` when this machine cannot hold the ranks; else the warnings to log.

    On GPUs each rank needs its own device, unless the ranks span a Ray cluster
    (``distributed_executor_backend=ray``: the cluster's GPUs count, which vLLM checks). On the CPU
    ranks may outnumber the cores: they then share them (slower, but the texts are the same).
    """
    ranks = options.world_size(max(1, machine.gpus))
    if machine.gpus:
        if ranks > machine.gpus and options.distributed_executor_backend != "ray":
            raise ConfigError(
                f"{_TP}={options.tensor_parallel_degree} x {_PP}={options.pipeline_parallel_degree} x "
                f"option.data_parallel_size={options.data_parallel_size} = {ranks} ranks, one GPU each, but "
                f"this machine has {machine.gpus} GPU(s){machine.gpu_note}; lower the degrees or set "
                "option.distributed_executor_backend=ray to span the nodes of a Ray cluster", field=_TP)
        return []
    if ranks > machine.cpus:
        return [f"{ranks} ranks share {machine.cpus} CPU core(s) ({machine.numa_nodes} NUMA node(s)): "
                "each step waits for every rank, so expect it to be slower than one rank"]
    return []
