"""Parallel options: parsing (``max``, env forms through the resolver), the refusals that name the
option, the model-split check against real config.json files, the machine check, vLLM's keywords
and the per-rank CPU lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from djl_handlers.config.models import ServingConfig
from djl_handlers.config.parallel import (
    Machine,
    ModelShape,
    ParallelOptions,
    check_machine_fit,
    check_model_split,
    tensor_degrees_that_split,
)
from djl_handlers.config.preflight import preflight
from djl_handlers.config.resolve import resolve_model
from djl_handlers.engines.external.vllm_config import engine_args_kwargs
from djl_handlers.engines.external.vllm_parallel import cpu_lists, parallel_kwargs
from djl_handlers.errors import ConfigError

# The embedded SmolLM2-135M's split-relevant config.json fields, and the tiny test model's.
SMOLLM2 = {"num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30, "intermediate_size": 1536}
TINY = {"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128}


def vllm_cfg(**options: str) -> ServingConfig:
    return ServingConfig.from_properties({"rolling_batch": "vllm", **options}, engine="vllm")


def test_defaults_and_values() -> None:
    assert vllm_cfg().parallel == ParallelOptions(1, 1, None, 1)
    c = vllm_cfg(tensor_parallel_degree="3", pipeline_parallel_degree="2", distributed_executor_backend="RAY",
                 data_parallel_size="2")
    assert c.parallel == ParallelOptions(3, 2, "ray", 2) and c.tensor_parallel_degree == 3
    assert c.parallel.world_size() == 12
    assert vllm_cfg(tensor_parallel_degree="max").parallel.tensor_parallel_degree == 1  # CPU: max = 1
    gpu = vllm_cfg(tensor_parallel_degree="max", device_id="0").parallel
    assert gpu.tensor_parallel_degree == -1 and gpu.world_size(gpus=8) == 8


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("pipeline_parallel_degree", "0", "an integer >= 1"),
    ("pipeline_parallel_degree", "two", "an integer >= 1"),
    ("distributed_executor_backend", "slurm", "mp, ray"),
    ("data_parallel_size", "-1", "an integer >= 1"),
    ("tensor_parallel_degree", "0", "'max'"),
])
def test_bad_values_name_the_option(key: str, value: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as info:
        vllm_cfg(**{key: value})
    assert info.value.field == f"option.{key}" and repr(value) in str(info.value) and allowed in str(info.value)


def test_hf_engine_refuses_a_split_and_names_who_can() -> None:
    with pytest.raises(ConfigError, match="cannot split it; tensor parallelism is vLLM's") as info:
        ServingConfig.from_properties({"tensor_parallel_degree": "2"}, engine="huggingface")
    assert info.value.field == "option.tensor_parallel_degree"
    with pytest.raises(ConfigError, match="no pipeline parallelism") as pp:
        ServingConfig.from_properties({"pipeline_parallel_degree": "2"}, engine="deepspeed")
    assert pp.value.field == "option.pipeline_parallel_degree"
    # max is "every device this engine can use": one for the HF engine; DeepSpeed keeps its ranks;
    # the HF handler with rolling_batch=vllm hands the model (and the degree) to vLLM
    tp = "tensor_parallel_degree"
    assert ServingConfig.from_properties({tp: "max", "device_id": "0"}).tensor_parallel_degree == -1
    assert ServingConfig.from_properties({tp: "2"}, engine="deepspeed").tensor_parallel_degree == 2
    assert ServingConfig.from_properties({tp: "2", "rolling_batch": "vllm"}).tensor_parallel_degree == 2


def test_env_forms_through_the_resolver(tmp_path: Path) -> None:
    """DJL's front end defaults both degrees from TENSOR/PIPELINE_PARALLEL_DEGREE (a config.json present)."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **SMOLLM2}))
    (tmp_path / "serving.properties").write_text("engine=Python\noption.rolling_batch=vllm\n")
    env = {"TENSOR_PARALLEL_DEGREE": "3", "PIPELINE_PARALLEL_DEGREE": "2"}
    resolved = resolve_model(tmp_path, env)
    config = ServingConfig.from_properties(resolved.options, resolved.server, engine="vllm")
    assert (config.parallel.tensor_parallel_degree, config.parallel.pipeline_parallel_degree) == (3, 2)
    most = resolve_model(tmp_path, {**env, "TENSOR_PARALLEL_DEGREE": "max"})
    assert ServingConfig.from_properties(most.options, most.server, engine="vllm").tensor_parallel_degree == 1  # CPU


def test_model_shape_and_the_degrees_that_split_it(tmp_path: Path) -> None:
    smol = ModelShape.from_config(SMOLLM2)
    assert smol == ModelShape(9, 3, 30, 1536)
    assert tensor_degrees_that_split(smol) == [1, 3]  # 9 heads, 3 KV heads; 9 does not divide the MLP width 1536
    assert tensor_degrees_that_split(ModelShape.from_config(TINY)) == [1, 2, 4]  # type: ignore[arg-type]
    multimodal = ModelShape.from_config({"text_config": {"num_attention_heads": 8, "num_hidden_layers": 4}})
    assert multimodal == ModelShape(8, 8, 4, None)  # KV heads default to the heads
    assert ModelShape.from_config({"model_type": "unknown"}) is None
    assert ModelShape.from_folder(tmp_path) is None  # no config.json: the engine checks


def test_model_split_refusal_names_counts_and_working_degrees() -> None:
    smol = ModelShape.from_config(SMOLLM2)
    with pytest.raises(ConfigError) as info:
        check_model_split(ParallelOptions(tensor_parallel_degree=2), smol)
    message = str(info.value)
    assert "option.tensor_parallel_degree=2" in message and "9 attention heads and 3 KV heads" in message
    assert message.endswith("degrees that work: 1, 3") and info.value.field == "option.tensor_parallel_degree"
    with pytest.raises(ConfigError, match="30 hidden layers .*1 to 30") as pp:
        check_model_split(ParallelOptions(pipeline_parallel_degree=31), smol)
    assert pp.value.field == "option.pipeline_parallel_degree"
    for ok in (ParallelOptions(3), ParallelOptions(3, 30), ParallelOptions(-1)):
        check_model_split(ok, smol)
    check_model_split(ParallelOptions(2), None)  # unknown shape: nothing to say


def test_machine_fit() -> None:
    with pytest.raises(ConfigError) as info:
        check_machine_fit(ParallelOptions(4, 2), Machine(cpus=16, numa_nodes=2, gpus=4, gpu_note=" (cuda)"))
    assert "= 8 ranks, one GPU each, but this machine has 4 GPU(s) (cuda)" in str(info.value)
    assert check_machine_fit(ParallelOptions(4, 2, "ray"), Machine(16, 2, 4)) == []  # the cluster holds them
    assert check_machine_fit(ParallelOptions(-1), Machine(16, 2, 4)) == []  # max = the 4 GPUs
    [warning] = check_machine_fit(ParallelOptions(3), Machine(cpus=2, numa_nodes=1))
    assert warning.startswith("3 ranks share 2 CPU core(s) (1 NUMA node(s))")
    assert check_machine_fit(ParallelOptions(2), Machine(cpus=2, numa_nodes=1)) == []


def test_vllm_keywords(tmp_path: Path) -> None:
    assert parallel_kwargs(vllm_cfg()) == {"tensor_parallel_size": 1}
    c = vllm_cfg(tensor_parallel_degree="3", pipeline_parallel_degree="2", distributed_executor_backend="mp",
                 data_parallel_size="2")
    assert parallel_kwargs(c) == {"tensor_parallel_size": 3, "pipeline_parallel_size": 2, "data_parallel_size": 2,
                                  "distributed_executor_backend": "mp"}
    kwargs = engine_args_kwargs(vllm_cfg(model_id=str(tmp_path), tensor_parallel_degree="3"))
    assert kwargs["tensor_parallel_size"] == 3 and "pipeline_parallel_size" not in kwargs
    assert "kv_cache_dtype" not in kwargs  # auto: vLLM's default


@pytest.mark.parametrize(("value", "want"), [("fp8", "fp8"), ("fp8_e5m2", "fp8_e5m2"), ("FP16", "float16"),
                                             ("bf16", "bfloat16"), ("bfloat16", "bfloat16")])
def test_kv_cache_dtype_goes_to_vllm_in_its_names(tmp_path: Path, value: str, want: str) -> None:
    kwargs = engine_args_kwargs(vllm_cfg(model_id=str(tmp_path), kv_cache_dtype=value))
    assert kwargs["kv_cache_dtype"] == want


@pytest.mark.parametrize(("ranks", "cpus", "expected"), [
    (3, [0, 1], [[0], [1], [0]]),  # more ranks than cores: shared round-robin
    (2, [0, 1], [[0], [1]]),
    (2, [0, 1, 2, 3, 4], [[0, 1, 2], [3, 4]]),
    (3, [4, 5, 6, 7, 8, 9, 10], [[4, 5, 6], [7, 8], [9, 10]]),
])
def test_cpu_lists(ranks: int, cpus: list[int], expected: list[list[int]]) -> None:
    lists = cpu_lists(ranks, cpus)
    assert lists == expected
    assert {c for cores in lists for c in cores} == set(cpus)  # every usable core is used


def test_preflight_refuses_a_degree_the_model_cannot_split(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **SMOLLM2}))
    options = {"model_id": str(model), "rolling_batch": "vllm", "tensor_parallel_degree": "2"}
    with pytest.raises(ConfigError, match="degrees that work: 1, 3"):
        preflight("djl_handlers.vllm", str(tmp_path), options, {})
    assert preflight("djl_handlers.vllm", str(tmp_path), {**options, "tensor_parallel_degree": "3"}, {}).serving_config
