"""ServingConfig: defaults, coercion, and errors naming key, value and what is allowed."""

from __future__ import annotations

import dataclasses

import pytest

from djl_handlers.config.models import ServingConfig
from djl_handlers.errors import ConfigError


def cfg(engine: str = "huggingface", server: dict[str, str] | None = None, **options: str) -> ServingConfig:
    if engine in ("vllm", "lmi-dist"):  # rolling-only engines need rolling_batch set
        options.setdefault("rolling_batch", "auto")
    return ServingConfig.from_properties(options, server, engine=engine)


def test_defaults() -> None:
    c = cfg()
    # unset rolling_batch = dynamic batching, as DJL's Java side never starts a rolling loop then
    assert (c.engine, c.rolling_batch, c.max_rolling_batch_size, c.batch_size) == ("huggingface", "disable", 32, 1)
    assert (c.max_batch_delay_ms, c.job_queue_size, c.dtype, c.device) == (100, 1000, "fp32", "cpu")
    assert (c.tensor_parallel_degree, c.trust_remote_code, c.enable_streaming) == (1, False, "false")
    assert (c.handler, c.output_formatter, c.tgi_compat, c.strict_parameters) == ("handle", None, False, True)
    assert (c.max_new_tokens_limit, c.predict_timeout_s, c.model_loading_timeout_s) == (4096, 120, 240)
    assert c.model_id is None and c.revision is None and c.max_model_len is None
    assert c.vllm.gpu_memory_utilization == 0.9 and c.deepspeed.max_tokens == 1024
    assert c.raw == {}


def test_values_are_typed_and_raw_keeps_everything() -> None:
    options = {
        "model_id": "gpt2", "model_dir": "/m", "entryPoint": "djl_handlers.huggingface",
        "rolling_batch": "Scheduler", "max_rolling_batch_size": "8", "dtype": "BF16",
        "trust_remote_code": "TRUE", "tgi_compat": "1", "strict_parameters": "0",
        "max_new_tokens_limit": "512", "output_formatter": "jsonlines", "revision": "main",
        "some_djl_key": "whatever", "low_cpu_mem_usage": "true", "attn_implementation": "sdpa",
        "predict_timeout": "30", "max_model_len": "2048",
    }
    c = ServingConfig.from_properties(options)
    assert c.model_id == "gpt2" and c.model_dir == "/m" and c.entry_point == "djl_handlers.huggingface"
    assert c.rolling_batch == "scheduler" and c.max_rolling_batch_size == 8 and c.dtype == "bf16"
    assert c.trust_remote_code is True and c.tgi_compat is True and c.strict_parameters is False
    assert c.max_new_tokens_limit == 512 and c.output_formatter == "jsonlines" and c.revision == "main"
    assert c.hf.low_cpu_mem_usage is True and c.hf.attn_implementation == "sdpa"
    assert c.predict_timeout_s == 30 and c.max_model_len == 2048
    assert c.raw == options


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg().dtype = "fp16"  # type: ignore[misc]


def test_empty_values_count_as_unset() -> None:
    c = cfg(dtype="", rolling_batch="  ", batch_size="")
    assert (c.dtype, c.rolling_batch, c.batch_size) == ("fp32", "disable", 1)


def test_data_type_alias() -> None:
    assert cfg(data_type="fp16").dtype == "fp16"


def test_server_keys_from_server_map_win() -> None:
    c = cfg(server={"batch_size": "4", "max_batch_delay": "10", "job_queue_size": "7"},
            batch_size="2", rolling_batch="disable")
    assert (c.batch_size, c.max_batch_delay_ms, c.job_queue_size) == (4, 10, 7)


@pytest.mark.parametrize(
    ("options", "key", "value", "allowed"),
    [
        ({"rolling_batch": "turbo"}, "option.rolling_batch", "turbo", "scheduler"),
        ({"dtype": "fp64"}, "option.dtype", "fp64", "bf16"),
        ({"trust_remote_code": "yes"}, "option.trust_remote_code", "yes", "true, false"),
        ({"max_rolling_batch_size": "0"}, "option.max_rolling_batch_size", "0", "integer >= 1"),
        ({"max_rolling_batch_size": "many"}, "option.max_rolling_batch_size", "many", "integer >= 1"),
        ({"tensor_parallel_degree": "0"}, "option.tensor_parallel_degree", "0", "'max'"),
        ({"enable_streaming": "maybe"}, "option.enable_streaming", "maybe", "huggingface"),
        ({"device": "tpu"}, "option.device", "tpu", "cuda:<n>"),
        ({"max_new_tokens_limit": "-5"}, "option.max_new_tokens_limit", "-5", "integer >= 1"),
        ({"attn_implementation": "magic"}, "option.attn_implementation", "magic", "sdpa"),
        ({"data_type": "int4"}, "option.data_type", "int4", "fp32"),
    ],
)
def test_errors_name_key_value_and_allowed(options: dict[str, str], key: str, value: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        ServingConfig.from_properties(options)
    message = str(err.value)
    assert key in message and repr(value) in message and allowed in message
    assert err.value.field == key


def test_server_key_error_uses_bare_key() -> None:
    with pytest.raises(ConfigError, match=r"batch_size='x'") as err:
        cfg(server={"batch_size": "x"})
    assert err.value.field == "batch_size"


def test_unknown_engine() -> None:
    with pytest.raises(ConfigError, match="engine='onnx'.*huggingface"):
        cfg(engine="onnx")


def test_engine_aliases() -> None:
    assert cfg(engine="trtllm").engine == "tensorrt_llm"


@pytest.mark.parametrize(
    ("engine", "rolling"),
    [("tensorrt_llm", "scheduler"), ("deepspeed", "vllm"), ("vllm", "disable"), ("vllm", "trtllm")],
)
def test_rolling_batch_must_fit_engine(engine: str, rolling: str) -> None:
    with pytest.raises(ConfigError, match=f"option.rolling_batch={rolling}.*engine {engine}"):
        cfg(engine=engine, rolling_batch=rolling)


def test_unset_rolling_batch_on_a_rolling_only_engine_says_what_to_set() -> None:
    with pytest.raises(ConfigError, match="option.rolling_batch is unset.*engine vllm.*set option.rolling_batch"):
        ServingConfig.from_properties({}, engine="vllm")


def test_mode_never_depends_on_batch_size() -> None:
    # DJL's test_model puts batch_size=len(inputs) into every call's properties
    assert cfg(server={"batch_size": "4"}, rolling_batch="auto").is_rolling is True
    assert cfg(batch_size="2", rolling_batch="scheduler").resolved_rolling_batch() == "scheduler"
    assert cfg(batch_size="2").is_rolling is False


def test_resolved_rolling_batch() -> None:
    assert cfg(rolling_batch="auto").resolved_rolling_batch() == "scheduler"
    assert cfg(engine="deepspeed", rolling_batch="auto").resolved_rolling_batch() == "scheduler"
    assert cfg(engine="vllm", rolling_batch="auto").resolved_rolling_batch() == "vllm"
    assert cfg(engine="lmi-dist", rolling_batch="auto").resolved_rolling_batch() == "lmi-dist"
    assert cfg(engine="tensorrt_llm", rolling_batch="auto").resolved_rolling_batch() == "trtllm"
    assert cfg().resolved_rolling_batch() == "disable"
    assert cfg(rolling_batch="disable").resolved_rolling_batch() == "disable"
    assert cfg(rolling_batch="auto").resolved_rolling_batch("tensorrt_llm") == "trtllm"
    assert cfg(rolling_batch="disable").is_rolling is False and cfg(rolling_batch="auto").is_rolling is True


def test_params_and_serving_engine() -> None:
    lmi = cfg(rolling_batch="lmi-dist")
    assert (lmi.params_engine, lmi.serving_engine) == ("lmi-dist", "vllm")
    assert (cfg(rolling_batch="vllm").params_engine, cfg().params_engine) == ("vllm", "huggingface")
    assert cfg(engine="tensorrt_llm").params_engine == "tensorrt_llm"
    assert cfg(engine="deepspeed", rolling_batch="disable").serving_engine == "deepspeed"


def test_max_rolling_batch_size_default_depends_on_backend() -> None:
    assert cfg(rolling_batch="vllm").max_rolling_batch_size == 256
    assert cfg(engine="lmi-dist").max_rolling_batch_size == 256
    assert cfg(engine="tensorrt_llm").max_rolling_batch_size == 32


def test_tensor_parallel_and_device() -> None:
    assert cfg(tensor_parallel_degree="max").tensor_parallel_degree == 1
    assert cfg(tensor_parallel_degree="max", device_id="0").tensor_parallel_degree == -1
    assert cfg("vllm", tensor_parallel_degree="4").tensor_parallel_degree == 4  # the HF engine: test_config_parallel
    assert cfg(device_id="1").device == "cuda:1"
    assert cfg(device_id="-1").device == "cpu"
    assert cfg(device="CUDA:2").device == "cuda:2"
    # a bare option.device=cuda takes the worker's GPU, and stays "cuda" for device_id -1 (never "cuda:-1")
    assert cfg(device="cuda", device_id="3").device == "cuda:3"
    assert cfg(device="cuda", device_id="-1").device == "cuda"
    assert cfg(device="cuda").device == "cuda"
    assert cfg(device="cuda:0", device_id="3").device == "cuda:0"


def test_engine_sub_configs() -> None:
    v = cfg(engine="vllm", enforce_eager="true", gpu_memory_utilization="0.5",
            max_rolling_batch_prefill_tokens="4096", max_model_len="1024").vllm
    assert (v.enforce_eager, v.gpu_memory_utilization, v.max_rolling_batch_prefill_tokens) == (True, 0.5, 4096)
    assert v.max_model_len == 1024
    with pytest.raises(ConfigError, match=r"option.gpu_memory_utilization='1.5'.*\(0.0, 1.0\]"):
        cfg(engine="vllm", gpu_memory_utilization="1.5")
    with pytest.raises(ConfigError, match="option.gpu_memory_utilization='nan'"):
        cfg(engine="vllm", gpu_memory_utilization="nan")
    d = cfg(engine="deepspeed", quantize="smoothquant", max_tokens="2048").deepspeed
    assert (d.quantize, d.max_tokens) == ("smoothquant", 2048)
    with pytest.raises(ConfigError, match="option.quantize='awq'.*dynamic_int8"):
        cfg(engine="deepspeed", quantize="awq")
    t = cfg(engine="tensorrt_llm", max_num_tokens="8192", batch_scheduler_policy="guaranteed_no_evict").trtllm
    assert (t.max_num_tokens, t.batch_scheduler_policy) == (8192, "guaranteed_no_evict")


def test_other_engines_options_are_not_validated() -> None:
    # a DeepSpeed-only quantize value is not checked (and not an error) for vLLM
    c = cfg(engine="vllm", quantize="smoothquant", low_cpu_mem_usage="junk-for-hf-only")
    assert c.raw["quantize"] == "smoothquant" and c.vllm.quantize == "smoothquant"
    assert c.hf.low_cpu_mem_usage is False
    with pytest.raises(ConfigError, match="option.enforce_eager='junk'"):
        cfg(engine="vllm", enforce_eager="junk")


def test_init_properties_as_djl_sends_them() -> None:
    # DJL's init call mixes options with engine-level keys such as device_id and batch_size
    c = ServingConfig.from_properties({"model_id": "m", "device_id": "-1", "batch_size": "1",
                                       "rolling_batch": "auto", "entryPoint": "djl_handlers.huggingface"})
    assert (c.device, c.batch_size, c.is_rolling) == ("cpu", 1, True)


@pytest.mark.parametrize(("value", "expected"), [("true", True), (" TRUE ", True), ("True", True),
                                                 ("false", False), ("yes", False), ("1", False), ("", False)])
def test_async_mode_is_djls_parse_boolean(value: str, expected: bool) -> None:
    """``option.async_mode`` as DJL's ``PyModel`` reads it: true only for "true" (any case)."""
    c = ServingConfig.from_properties({"model_id": "m", "rolling_batch": "disable", "async_mode": value},
                                      engine="vllm" if expected else "huggingface")
    assert c.async_mode is expected
    assert ServingConfig.from_properties({"model_id": "m"}).async_mode is False
